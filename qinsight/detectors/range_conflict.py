"""Operands an add or a cat puts on one scale although their ranges differ by orders of magnitude.

A quantized add requantizes ``a + b`` with the output's scale, which the wider
operand sets; a quantized cat gives all its operands one scale; an add or a
mul with a scalar (``x * -1e4``) shares one observer between its input and
its output in FX, so the input is quantized with the output's scale. The
narrower operand then keeps

    bits kept = activation bits - log2(output range / operand range)

of its information: BERT's ``scores + mask`` (scores within ±20 next to a
-10,000 padding mask) keeps none, so the softmax after it sees noise; its
``(1 - mask) * -1e4`` quantizes the 0/1 mask with a step of 79, making it all
zeros; a
residual stream with massive channels next to the branch it adds leaves the
branch a few levels. Below ``min_bits`` the op is suggested to stay in float,
with the bits lost as the evidence. (A mul of two tensors, or a matmul, gives
each operand its own scale and multiplies: nothing is squeezed, nothing judged.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs

from qinsight.core.findings import Finding
from qinsight.core.precision import activation_bits, bits_kept, quantized_range
from qinsight.core.report import DetectorResult
from qinsight.core.sites import InsertPoint, OpKind, OpSite, Side
from qinsight.core.stats import ActivationStats, DataCondition, ObservedStats
from qinsight.core.suggestions import QuantSuggestion
from qinsight.detectors._validators import installed_backend, positive
from qinsight.plugin.detector import API_VERSION, result_of

if TYPE_CHECKING:
    from qinsight.plugin.detector import ModelView

_OPERANDS = (Side.PRE, Side.OTHER)


def _range(stats: ActivationStats | None) -> float | None:
    return None if stats is None or stats.condition is DataCondition.NO_DATA else quantized_range(stats)


@attrs.frozen(kw_only=True)
class RangeConflictFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = (
        "left in float",
        "no calibration data",
        "range conflict",
        "ranges agree",
        "separate scales",
    )

    kind: OpKind
    quantized: bool
    activation_bits: int
    min_bits: float
    operand_ranges: tuple[float, ...]  # first and second operand, where measured
    output_range: float | None

    @property
    def separate_scales(self) -> bool:
        """A mul of two tensors: each operand has its own scale."""
        return self.kind is OpKind.MUL and len(self.operand_ranges) > 1

    @property
    def bits_kept(self) -> float | None:
        """What the narrowest operand keeps under the shared scale (the output's, or the widest operand's for cat)."""
        if self.output_range is None or not self.operand_ranges or self.separate_scales:
            return None
        shared = max(self.output_range, *self.operand_ranges)
        return bits_kept(self.activation_bits, shared, min(self.operand_ranges))

    @property
    def verdict(self) -> str:
        if not self.quantized:
            return "left in float"
        if self.separate_scales:
            return "separate scales"
        kept = self.bits_kept
        if kept is None:
            return "no calibration data"
        return "range conflict" if kept < self.min_bits else "ranges agree"

    @property
    def actionable(self) -> bool:
        return self.verdict in ("range conflict", "no calibration data")

    def severity(self) -> float | None:
        """The bits the narrower operand loses under the shared scale: fewer kept is worse."""
        kept = self.bits_kept
        return -kept if kept is not None else None

    def reason(self) -> str:
        kept = self.bits_kept
        if not self.quantized:
            return f"{self.kind.value}: the flow leaves it in float"
        if self.separate_scales:
            return f"{self.kind.value}: two tensor operands, each on its own scale"
        if kept is None:
            return "no finite activation reached it"
        if len(self.operand_ranges) == 1:  # a scalar operand: input and output share FX's observer
            shared = (
                f"input range {self.operand_ranges[0]:.3g} and output range {self.output_range:.3g} share one scale"
            )
            return f"{self.kind.value}: {shared}; the input keeps {kept:.1f} of {self.activation_bits} bits"
        ranges = " and ".join(f"{r:.3g}" for r in self.operand_ranges)
        return (
            f"{self.kind.value}: operand ranges {ranges} share one scale (output range {self.output_range:.3g}); "
            f"the narrower keeps {kept:.1f} of {self.activation_bits} bits"
        )


@attrs.frozen(kw_only=True)
class RangeConflictDetector:
    """Finds adds and cats whose narrower operand loses most of its bits to the shared scale."""

    id: ClassVar[str] = "qinsight.range_conflict"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = RangeConflictFinding

    backend: str = attrs.field(default="x86", validator=installed_backend())
    min_bits: float = attrs.field(default=4.0, validator=positive(minimum=0.0))

    @staticmethod
    def _judged(view: ModelView) -> tuple[OpSite, ...]:
        return tuple(site for site in view.ops if site.kind.shares_scale)

    @staticmethod
    def _points(site: OpSite) -> tuple[InsertPoint, ...]:
        return tuple(InsertPoint.at(site, side) for side in (*_OPERANDS, Side.POST)) if site.quantized else ()

    def insert_points(self, view: ModelView) -> tuple[InsertPoint, ...]:
        return tuple(point for site in self._judged(view) for point in self._points(site))

    def _finding(self, site: OpSite, stats: ObservedStats) -> RangeConflictFinding:
        ranges = {point.side: _range(stats.for_point(point)) for point in self._points(site)}
        return RangeConflictFinding(
            fqn=site.fqn,
            kind=site.kind,
            quantized=site.quantized,
            activation_bits=activation_bits(self.backend),
            min_bits=self.min_bits,
            operand_ranges=tuple(r for side in _OPERANDS if (r := ranges.get(side)) is not None),
            output_range=ranges.get(Side.POST),
        )

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        findings = [self._finding(site, stats) for site in self._judged(view)]
        suggestions = [
            QuantSuggestion(fqn=f.fqn, keep_float=True, sources=(self.id,))
            for f in findings
            if f.verdict == "range conflict"
        ]
        return result_of(self, findings, suggestions)
