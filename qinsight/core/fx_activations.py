"""How qinsight's FX config observes static activations where torch's defaults do worse.

torch's x86 (fbgemm) default observes every activation with 7 of its 8 bits
(``reduce_range``): fbgemm's kernels add products pairwise in 16 bits, and 8-bit
inputs can saturate those sums. Every backend's default (onednn's and qnnpack's
too) also observes a layer before the ReLU6 that reads it. On MobileNetV2 the
two together cost 7 dB at the output under x86 (9.5 against PT2E's 16.9), the
second alone 2 dB under onednn. qinsight's config observes with all 8 bits, and
a layer that a clip alone reads as the clip leaves it (:mod:`qinsight.apply.clipped`),
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
    bits; ``kernels`` is how many quantized kernels the check compared.

    The check quantizes the report's config for real, so it runs where the config is verified
    (``verify_report``, a plan), not at diagnosis: ``checked`` is false until then (absent before 3.1:
    true), and an unverified report, a merge among them, observes at 8 bits with nothing narrowed. A
    check depends on the suggestions, which a shard's statistics decide otherwise than all the data's:
    left to verification, the merge of a run's shards is that run, field for field."""

    bits: int = attrs.field(default=8, validator=attrs.validators.in_((7, 8)))
    narrowed: tuple[NarrowedInput, ...] = ()
    kernels: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    checked: bool = True

    @classmethod
    def merged(cls, checks: Sequence[FxActivations | None]) -> FxActivations | None:
        """Several diagnoses' observing as one (report files merged): unchecked, as a merge verifies
        nothing (``verify_report`` on the merged report checks it); ``None`` if any kept torch's."""
        if not checks or any(check is None for check in checks):
            return None
        return cls(checked=False)

    @property
    def narrowed_fqns(self) -> frozenset[str]:
        return frozenset(n.fqn for n in self.narrowed)

    def describe(self) -> str:
        """One line for the report's text."""
        if not self.checked:
            unchecked = "the backend's kernels not checked for saturation: verification checks them"
            return f"FX activations at {self.bits} bits, clip-aware ({unchecked})"
        checked = f"{self.kernels} quantized kernels checked at {self.bits} bits"
        if not self.narrowed:
            return f"FX activations at {self.bits} bits, clip-aware ({checked}: none saturates)"
        names = ", ".join(n.fqn for n in self.narrowed[:5]) + (", ..." if len(self.narrowed) > 5 else "")
        saturating = f"inputs of {names} at 7: their kernels saturate"
        return f"FX activations at {self.bits} bits, clip-aware ({checked}; {saturating})"


__all__ = ["FxActivations", "NarrowedInput"]
