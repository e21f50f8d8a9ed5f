"""How qinsight's FX config observes static activations where torch's defaults do worse.

torch's x86 (fbgemm) default observes every activation with 7 of its 8 bits
(``reduce_range``): fbgemm's kernels add products pairwise in 16 bits, and 8-bit
inputs can saturate those sums. Every backend's default (onednn's and qnnpack's
too) also observes a layer before the ReLU6 that reads it. On MobileNetV2 the
two together cost 7 dB at the output under x86 (9.5 against PT2E's 16.9), the
second alone 2 dB under onednn. qinsight's config observes with all 8 bits, and
a layer that a clip alone reads as the clip leaves it (:mod:`qinsight.pipeline.clipped`),
where the layer's input is observed by its quantized producer.

Whether 8 bits saturate depends on the kernels and the data, so it is
measured: the model is quantized that way on a calibration batch, with the
backend's own kernels, and each quantized kernel's output is compared with the
exact result of the same integer inputs and weights. A kernel more than one step
off (rounding is at most one) reads its input at 7 bits again (``narrowed``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen(kw_only=True)
class NarrowedInput:
    """A quantized layer whose kernel saturated at 8-bit inputs: its input stays at 7 bits."""

    fqn: str
    # the error its outputs carry beyond rounding, in units of the rounding noise every output has
    excess: float = attrs.field(validator=attrs.validators.ge(0.0))


@attrs.frozen(kw_only=True)
class FxActivations:
    """qinsight's FX activation observing: ``bits`` wide, clip-aware, with the ``narrowed`` inputs at 7
    bits; ``kernels`` is how many quantized kernels the check compared."""

    bits: int = attrs.field(default=8, validator=attrs.validators.in_((7, 8)))
    narrowed: tuple[NarrowedInput, ...] = ()
    kernels: int = attrs.field(default=0, validator=attrs.validators.ge(0))

    @classmethod
    def merged(cls, checks: Sequence[FxActivations | None]) -> FxActivations | None:
        """Several diagnoses' checks as one (report files merged): each kernel narrowed that any of them
        narrowed, with the largest excess; ``None`` if any of them kept torch's observing."""
        if not checks or any(check is None for check in checks):
            return None
        known = [check for check in checks if check is not None]
        excess: dict[str, float] = {}
        for check in known:
            for narrowed in check.narrowed:
                excess[narrowed.fqn] = max(narrowed.excess, excess.get(narrowed.fqn, 0.0))
        return cls(
            bits=min(check.bits for check in known),
            narrowed=tuple(NarrowedInput(fqn=fqn, excess=value) for fqn, value in excess.items()),
            kernels=max(check.kernels for check in known),
        )

    @property
    def narrowed_fqns(self) -> frozenset[str]:
        return frozenset(n.fqn for n in self.narrowed)

    def describe(self) -> str:
        """One line for the report's text."""
        checked = f"{self.kernels} quantized kernels checked at {self.bits} bits"
        if not self.narrowed:
            return f"FX activations at {self.bits} bits, clip-aware ({checked}: none saturates)"
        names = ", ".join(n.fqn for n in self.narrowed[:5]) + (", ..." if len(self.narrowed) > 5 else "")
        return f"FX activations at {self.bits} bits, clip-aware ({checked}; inputs of {names} at 7: their kernels saturate)"


__all__ = ["FxActivations", "NarrowedInput"]
