"""SmoothingMapping: SmoothQuant's per-channel factors for the inputs of Linear layers, as a type of its own.

A Linear's input ``x`` with a few wide channels leaves the others few levels
under one per-tensor activation scale, and FX's x86 flow quantizes that input
per tensor with 7 bits, statically or per batch. Dividing input channel ``j``
by ``s_j`` and multiplying weight column ``j`` by it computes the same
function (``(x / s) @ (W * s).T == x @ W.T``) and moves the range from the
activation, quantized per tensor, to the weight, quantized per output channel.
``s_j = max|x_j| ** alpha / max|W_{:, j}| ** (1 - alpha)`` (Xiao et al., 2023).

torch's own equalization (``prepare_fx(..., _equalization_config=...)``)
cannot do this for inputs of rank 3, (batch, tokens, features), and folds the
factors into a producer that must be a plain Linear. A smoothed model instead
divides the input explicitly: :func:`qinsight.smoothed` replaces each
named Linear with :class:`~qinsight.apply.smoothed_model.SmoothedLinear`, whose
input multiplication stays in float. The Linear then answers to
``<fqn>.linear`` and the multiplication to ``<fqn>.mul#0``, which is how a
plan made on the smoothed model names them.
"""

from __future__ import annotations

import math

import attrs

from qinsight.core.errors import InvalidValueError


def _positive_finite(_instance: object, _attribute: object, factors: tuple[float, ...]) -> None:
    if not factors:
        raise InvalidValueError("a smoothing entry needs one factor per input channel, not none")
    bad = next((f for f in factors if not (math.isfinite(f) and f > 0.0)), None)
    if bad is not None:
        raise InvalidValueError(f"smoothing factors must be positive and finite, not {bad}")


@attrs.frozen(kw_only=True)
class SmoothingEntry:
    """Divide the input of the Linear ``fqn`` by ``factors`` (one per input channel) and multiply
    its weight's columns by them. ``alpha`` is the migration strength chosen; ``sqnr_before`` and
    ``sqnr_after`` the Linear's output SQNR (dB) under the flow's activation and weight
    quantization without and with the factors, measured on the calibration data."""

    fqn: str
    alpha: float = attrs.field(validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    factors: tuple[float, ...] = attrs.field(validator=_positive_finite)
    sqnr_before: float
    sqnr_after: float


@attrs.frozen(kw_only=True)
class SmoothingMapping:
    """The Linears to smooth, in forward order (none: the model is used as it is)."""

    entries: tuple[SmoothingEntry, ...] = ()

    def __attrs_post_init__(self) -> None:
        names = [entry.fqn for entry in self.entries]
        if len(set(names)) != len(names):
            raise InvalidValueError(
                f"each Linear may be smoothed once; repeated: {sorted({n for n in names if names.count(n) > 1})}"
            )

    @property
    def fqns(self) -> tuple[str, ...]:
        return tuple(entry.fqn for entry in self.entries)

    @property
    def divisions(self) -> tuple[str, ...]:
        """The sites of the smoothed model that divide the inputs (``<fqn>.mul#0``)."""
        return tuple(f"{entry.fqn}.mul#0" for entry in self.entries)

    def __len__(self) -> int:
        return len(self.entries)
