"""Dynamic vs static activations (torch's DynamicStaticDetector).

Observes the input and output of every Linear and Conv. An activation is
stationary when its stationarity statistic is strictly above ``tolerance``;
dynamic quantization is recommended when the output is not stationary, as in
torch. Only Linear supports dynamic quantization; a Conv whose output is not
stationary is reported but kept static.

Two statistics are offered:

* ``Stationarity.BATCH_RANGE`` (default, torch's): S = mean batch range /
  epoch range.
* ``Stationarity.VARIANCE``: the variance-based statistic of
  :meth:`qinsight.core.stats.BatchMoments.stationarity`, which one outlier cannot
  swing the way it swings the epoch range.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, ClassVar

import attrs

from qinsight.core.findings import Finding
from qinsight.core.report import DetectorResult
from qinsight.core.sites import InsertPoint, OpKind, OpSite, Side
from qinsight.core.stats import ActivationStats, DataCondition, ObservedStats
from qinsight.core.suggestions import ActivationMode, QuantSuggestion
from qinsight.detectors._validators import in_open_interval
from qinsight.plugin.detector import API_VERSION, result_of

if TYPE_CHECKING:
    from qinsight.plugin.detector import ModelView

DYNAMIC_SUPPORTED = frozenset({OpKind.LINEAR})


class Stationarity(enum.Enum):
    BATCH_RANGE = "batch_range"
    VARIANCE = "variance"


@attrs.frozen(kw_only=True)
class ActivationVerdict:
    """The stationarity of one side of a module."""

    statistic: float | None  # None when undefined: see ``condition``
    condition: DataCondition
    batches: int
    nonfinite_batches: int
    constant_batches: int

    def stationary(self, tolerance: float) -> bool | None:
        """Whether a static range fits; a constant activation is trivially stationary."""
        if self.condition is DataCondition.CONSTANT:
            return True
        if self.statistic is None:
            return None
        return self.statistic > tolerance

    def describe(self, tolerance: float) -> str:
        stationary = self.stationary(tolerance)
        if stationary is None:
            return "no data"
        if self.statistic is None:
            return self.condition.value
        return f"{self.statistic:.3f} ({'stationary' if stationary else 'non-stationary'})"


@attrs.frozen(kw_only=True)
class DynamicStaticFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = (
        "no calibration data",
        "static",
        "dynamic recommended",
        "non-stationary, dynamic unsupported",
    )

    kind: OpKind
    statistic: Stationarity
    tolerance: float
    input: ActivationVerdict
    output: ActivationVerdict

    @property
    def dynamic_supported(self) -> bool:
        return self.kind in DYNAMIC_SUPPORTED

    @property
    def dynamic_recommended(self) -> bool | None:
        """torch's rule: dynamic iff the output is not stationary; ``None`` without data."""
        stationary = self.output.stationary(self.tolerance)
        return None if stationary is None else not stationary

    @property
    def verdict(self) -> str:
        recommended = self.dynamic_recommended
        if recommended is None:
            return "no calibration data"
        if not recommended:
            return "static"
        return "dynamic recommended" if self.dynamic_supported else "non-stationary, dynamic unsupported"

    @property
    def actionable(self) -> bool:
        recommended = self.dynamic_recommended
        return recommended is None or (recommended and self.dynamic_supported)

    def reason(self) -> str:
        if self.dynamic_recommended is None:
            bad = self.output.nonfinite_batches
            return f"no finite activation reached it ({bad} batches with NaN/Inf)" if bad else "never ran"
        t = self.tolerance
        return (
            f"S_in={self.input.describe(t)} S_out={self.output.describe(t)} [{self.statistic.value}, tolerance {t:g}]"
        )


def _verdict(stats: ActivationStats | None, statistic: Stationarity) -> ActivationVerdict:
    if stats is None:
        return ActivationVerdict(
            statistic=None, condition=DataCondition.NO_DATA, batches=0, nonfinite_batches=0, constant_batches=0
        )
    if statistic is Stationarity.BATCH_RANGE:
        value = stats.batch_to_epoch_ratio()
    else:
        value = None if stats.moments is None else stats.moments.stationarity()
    return ActivationVerdict(
        statistic=value,
        condition=stats.condition,
        batches=stats.batches,
        nonfinite_batches=stats.nonfinite_batches,
        constant_batches=stats.constant_batches,
    )


@attrs.frozen(kw_only=True)
class DynamicStaticDetector:
    """Recommends dynamic quantization where a module's output is not stationary."""

    id: ClassVar[str] = "qinsight.dynamic_static"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = DynamicStaticFinding

    tolerance: float = attrs.field(default=0.5, validator=in_open_interval(0.0, 1.0))
    statistic: Stationarity = attrs.field(default=Stationarity.BATCH_RANGE, converter=Stationarity)

    def _points(self, site: OpSite) -> tuple[InsertPoint, InsertPoint]:
        moments = self.statistic is Stationarity.VARIANCE
        return (
            InsertPoint.at(site, Side.PRE, moments=moments),
            InsertPoint.at(site, Side.POST, moments=moments),
        )

    def insert_points(self, view: ModelView) -> tuple[InsertPoint, ...]:
        return tuple(point for site in view.sites for point in self._points(site))

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        findings = []
        suggestions = []
        for site in view.sites:
            pre, post = self._points(site)
            finding = DynamicStaticFinding(
                fqn=site.fqn,
                kind=site.kind,
                statistic=self.statistic,
                tolerance=self.tolerance,
                input=_verdict(stats.for_point(pre), self.statistic),
                output=_verdict(stats.for_point(post), self.statistic),
            )
            findings.append(finding)
            recommended = finding.dynamic_recommended
            if recommended is not None:
                dynamic = recommended and finding.dynamic_supported
                mode = ActivationMode.DYNAMIC if dynamic else ActivationMode.STATIC
                suggestions.append(QuantSuggestion(fqn=site.fqn, activation=mode, sources=(self.id,)))
        return result_of(self, findings, suggestions)
