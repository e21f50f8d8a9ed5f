"""Bits left to the typical channel of an op's input and output under one per-tensor scale.

FX and PT2E quantize the activations around adds, norms, softmax and the rest
per tensor: one scale spans the widest channel. A channel whose range is a
small fraction of the tensor's gets few of the activation's levels, and values
within one step of each other collapse to one level. Per quantized op site
(``view.ops``), the input and the output are observed per channel and

    bits kept = activation bits - log2(tensor range / median channel range)

is the number of bits the median channel's range spans. Below ``min_bits`` the
op is suggested to stay in float: its quantized tensors would carry less than
that for most channels (a residual stream whose few massive channels dwarf
the rest is the common case, in BERT and in decoder LLMs alike).

Activation bits are those of qinsight's configs: 8 (its FX config observes x86
and fbgemm activations at 8 bits where their kernels do not saturate, where
torch's default keeps 7: :mod:`qinsight.core.fx_activations`). Ops the flow
leaves in float get a finding saying so and no observer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs

from qinsight.core.findings import Finding
from qinsight.core.precision import SideBits, activation_bits, side_bits
from qinsight.core.report import DetectorResult
from qinsight.core.sites import InsertPoint, OpKind, OpSite, Side
from qinsight.core.stats import ObservedStats
from qinsight.core.suggestions import ActivationMode, QuantSuggestion
from qinsight.detectors._validators import installed_backend, positive
from qinsight.plugin.detector import API_VERSION, result_of

if TYPE_CHECKING:
    from qinsight.plugin.detector import ModelView


@attrs.frozen(kw_only=True)
class PrecisionFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = ("left in float", "no calibration data", "too few bits", "enough bits")

    kind: OpKind
    quantized: bool
    activation_bits: int
    min_bits: float
    sides: tuple[SideBits, ...]

    @property
    def worst(self) -> SideBits | None:
        return min(self.sides, key=lambda s: s.bits_kept, default=None)

    @property
    def verdict(self) -> str:
        if not self.quantized:
            return "left in float"
        worst = self.worst
        if worst is None:
            return "no calibration data"
        return "too few bits" if worst.bits_kept < self.min_bits else "enough bits"

    @property
    def actionable(self) -> bool:
        return self.verdict in ("too few bits", "no calibration data")

    def severity(self) -> float | None:
        """The bits the worst side's median channel loses: fewer kept is worse."""
        return -self.worst.bits_kept if self.worst is not None else None

    def reason(self) -> str:
        if not self.quantized:
            return f"{self.kind.value}: the flow leaves it in float"
        worst = self.worst
        if worst is None:
            return "no finite activation reached it"
        what = {Side.PRE: "input", Side.POST: "output"}.get(worst.side, worst.side.value)
        collapsed = (
            f"; {worst.collapsed_channels} of {worst.channels} channels span less than one step"
            if worst.collapsed_channels
            else ""
        )
        return (
            f"{self.kind.value}: its {what}'s median channel keeps {worst.bits_kept:.1f} of {self.activation_bits} "
            "bits "
            f"under one scale (tensor range {worst.tensor_range:.3g}, median channel {worst.median_channel_range:.3g}, "
            f"channel {worst.widest_channel} spans {worst.widest_channel_range:.3g}){collapsed}"
        )


@attrs.frozen(kw_only=True)
class PrecisionDetector:
    """Finds quantized ops whose per-tensor activation scale leaves most channels few bits."""

    id: ClassVar[str] = "qinsight.precision"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = PrecisionFinding

    backend: str = attrs.field(default="x86", validator=installed_backend())
    min_bits: float = attrs.field(default=4.0, validator=positive(minimum=0.0))

    @property
    def bits(self) -> int:
        return activation_bits(self.backend)

    @staticmethod
    def _points(site: OpSite) -> tuple[InsertPoint, ...]:
        if not site.quantized:
            return ()
        if site.kind.is_layer:
            sides: tuple[Side, ...] = (Side.PRE,)  # its output is the next op's input
        elif site.kind is OpKind.EMBEDDING:
            sides = (Side.POST,)  # its input is token ids
        else:
            sides = (Side.PRE, Side.POST)
        return tuple(InsertPoint.at(site, side, per_channel=True) for side in sides)

    @staticmethod
    def _judged(view: ModelView) -> tuple[OpSite, ...]:
        return tuple(site for site in view.sites if site.kind is OpKind.LINEAR) + view.ops

    def insert_points(self, view: ModelView) -> tuple[InsertPoint, ...]:
        return tuple(point for site in self._judged(view) for point in self._points(site))

    def _finding(self, site: OpSite, stats: ObservedStats) -> PrecisionFinding:
        measured = (side_bits(point.side, stats.for_point(point), self.bits) for point in self._points(site))
        return PrecisionFinding(
            fqn=site.fqn,
            kind=site.kind,
            quantized=site.quantized,
            activation_bits=self.bits,
            min_bits=self.min_bits,
            sides=tuple(side for side in measured if side is not None),
        )

    def _suggestion(self, finding: PrecisionFinding) -> QuantSuggestion:
        if finding.kind is OpKind.LINEAR:
            # Dynamic quantization takes each batch's own range and keeps the tensor float outside the
            # kernel, so float neighbours stay float (FX lowers a float op between quantized ones).
            return QuantSuggestion(fqn=finding.fqn, activation=ActivationMode.DYNAMIC, sources=(self.id,))
        return QuantSuggestion(fqn=finding.fqn, keep_float=True, sources=(self.id,))

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        findings = [self._finding(site, stats) for site in self._judged(view)]
        suggestions = [self._suggestion(f) for f in findings if f.verdict == "too few bits"]
        return result_of(self, findings, suggestions)
