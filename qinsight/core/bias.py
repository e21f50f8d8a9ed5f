"""BiasCorrection: the bias shift that undoes the mean error a flow's quantized weights add, per layer.

Rounding a layer's weight to int8 changes its output by ``(W_q - W) x``. Over
the data that error need not average to zero: a channel whose rounded weights
lean one way shifts its whole output, and a depthwise conv (nine weights a
channel) leans far more than a wide Linear. The next layer's quantization
then sees the shifted range, and the shifts add up layer after layer. The
expected shift ``E[(W_q - W) x]`` per output channel, measured on calibration
data, is subtracted from the layer's bias (Nagel et al., "Data-Free
Quantization Through Weight Equalization and Bias Correction", 2019, the
empirical form; NNCF and AIMET apply it by default). Every layer stays int8:
the bias is float in the model the flow quantizes, and the backend quantizes
it into the int32 bias it was going to compute anyway.

``W_q`` is what the flow really computes with, read from its converted model
(:mod:`qinsight.apply.bias_correction`), BatchNorm folded in where the flow
folds it; the shift then goes into that BatchNorm's bias, so the model keeps
its structure and the flow folds the corrected bias as it folded the old one.
"""

from __future__ import annotations

import math

import attrs

from qinsight.core.errors import InvalidValueError


def _finite(_instance: object, _attribute: object, shift: tuple[float, ...]) -> None:
    if not shift:
        raise InvalidValueError("a bias shift needs one value per output channel, not none")
    bad = next((value for value in shift if not math.isfinite(value)), None)
    if bad is not None:
        raise InvalidValueError(f"bias shifts must be finite, not {bad}")


@attrs.frozen(kw_only=True)
class BiasShift:
    """Subtract ``shift`` (one value per output channel) from the bias of ``into``: the mean change the
    flow's quantized weight of layer ``fqn`` made to its output on the calibration data. ``into`` is the
    layer itself, or the BatchNorm after it that the flow folds into it (the shift is then in that
    BatchNorm's output). ``size``: the shift against the spread of the output it moves, channel by
    channel (root mean square over the channels of ``shift / std``): 0.1 moves a typical channel by a
    tenth of its standard deviation."""

    fqn: str
    into: str
    shift: tuple[float, ...] = attrs.field(validator=_finite)
    size: float = attrs.field(validator=attrs.validators.ge(0.0))

    def describe(self) -> str:
        where = "" if self.into == self.fqn else f" (into {self.into})"
        largest = max(abs(value) for value in self.shift)
        return f"{self.fqn}{where}: {len(self.shift)} channels, size {self.size:.3f}, largest shift {largest:.3g}"


@attrs.frozen(kw_only=True)
class BiasCorrection:
    """The layers whose bias to correct, in forward order (none: the model is quantized as it is)."""

    entries: tuple[BiasShift, ...] = ()

    def __attrs_post_init__(self) -> None:
        targets = [entry.into for entry in self.entries]
        if len(set(targets)) != len(targets):
            repeated = sorted({name for name in targets if targets.count(name) > 1})
            raise InvalidValueError(f"each bias may be corrected once; repeated: {repeated}")

    @property
    def fqns(self) -> tuple[str, ...]:
        return tuple(entry.fqn for entry in self.entries)

    def largest(self, count: int) -> tuple[BiasShift, ...]:
        """The ``count`` entries of largest size, largest first."""
        return tuple(sorted(self.entries, key=lambda entry: -entry.size)[:count])

    def __len__(self) -> int:
        return len(self.entries)


__all__ = ["BiasCorrection", "BiasShift"]
