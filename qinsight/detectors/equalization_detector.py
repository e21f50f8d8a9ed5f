"""Input-weight equalization (torch's InputWeightEqualizationDetector, verdict fixed).

For each Linear/Conv, per input channel ``c``:

* ``r_i[c]`` = input range of channel ``c`` / the input's global range (pre-observer);
* ``r_w[c]`` = weight range of the weights that read channel ``c`` / the
  weight's global range;
* ``s_c = sqrt(r_w[c]) / sqrt(r_i[c])``, the scale equalization would apply.

Equalization helps where ``s_c`` is far from 1: input and weight disagree on
how wide channel ``c`` is. A channel is recommended when ``s_c < t`` or
``s_c > 1/t``; torch recommends the opposite (``t <= s_c <= 1/t``), i.e. the
channels that are already balanced (docs/divergences.md). A module is
recommended when the share of recommended channels reaches
``channel_fraction`` (torch's 0.4).

Grouped and depthwise convs pair each input channel with its own group's
weights; torch tiles the weight ratios instead, mixing the groups.

A Linear called on 3-D (batch, tokens, features) inputs gets its finding but
no suggestion: FX's equalization observes axis 1, the token axis, and raises
once sequence lengths differ (docs/divergences.md), so a report that
suggested it would break ``prepare_fx`` for a user following it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import attrs

from qinsight.core.findings import Finding
from qinsight.core.report import DetectorResult
from qinsight.core.sites import InsertPoint, OpKind, OpSite, Side
from qinsight.core.stats import ActivationStats, DataCondition, ObservedStats
from qinsight.core.suggestions import QuantSuggestion
from qinsight.detectors._validators import in_open_interval
from qinsight.plugin.detector import API_VERSION, result_of

if TYPE_CHECKING:
    from qinsight.plugin.detector import ModelView


@attrs.frozen(kw_only=True)
class EqualizationFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = (
        "equalization recommended",
        "balanced",
        *(f"equalization not measurable ({c.value})" for c in DataCondition if c is not DataCondition.OK),
    )

    kind: OpKind
    ratio_threshold: float
    channel_fraction: float
    condition: DataCondition  # of the input; CONSTANT also when the weight's range is 0
    input_ranges: tuple[float, ...]
    weight_ranges: tuple[float, ...]
    scores: tuple[float, ...]  # s_c per input channel; nan where a channel's range is 0
    recommended_channels: tuple[int, ...]
    # False for a Linear on 3-D inputs: FX's equalization cannot apply to it, nothing is suggested
    applicable: bool = True

    @property
    def channel_share(self) -> float:
        return len(self.recommended_channels) / len(self.scores) if self.scores else 0.0

    @property
    def recommended(self) -> bool:
        return self.condition is DataCondition.OK and self.channel_share >= self.channel_fraction

    @property
    def verdict(self) -> str:
        if self.condition is not DataCondition.OK:
            return f"equalization not measurable ({self.condition.value})"
        return "equalization recommended" if self.recommended else "balanced"

    @property
    def actionable(self) -> bool:
        return self.recommended

    def severity(self) -> float | None:
        """The share of channels equalization would rescale."""
        return self.channel_share

    def reason(self) -> str:
        if self.condition is not DataCondition.OK:
            return f"{self.kind.value}: input or weight range is {self.condition.value}"
        finite = sorted(s for s in self.scores if math.isfinite(s))
        median = finite[len(finite) // 2] if finite else math.nan
        caveat = "" if self.applicable else "; FX cannot equalize a Linear on 3-D inputs: not suggested"
        return (
            f"{len(self.recommended_channels)}/{len(self.scores)} channels with s_c outside "
            f"[{self.ratio_threshold:g}, {1 / self.ratio_threshold:g}] (median s_c {median:.2f}){caveat}"
        )


def _ranges(stats: ActivationStats | None) -> tuple[float, ...]:
    if stats is None or stats.channel_min is None or stats.channel_max is None:
        return ()
    return tuple(hi - lo for lo, hi in zip(stats.channel_min, stats.channel_max))


def _scores(
    input_ranges: tuple[float, ...], input_global: float, weight_ranges: tuple[float, ...], weight_global: float
) -> tuple[float, ...]:
    """s_c per channel; ranges are normalized by the global range (max - min), as in torch."""
    scores = []
    for ri, rw in zip(input_ranges, weight_ranges):
        if ri == 0.0 or rw == 0.0:
            scores.append(math.nan)  # a dead channel: no scale can balance it
        else:
            scores.append(math.sqrt(rw / weight_global) / math.sqrt(ri / input_global))
    return tuple(scores)


@attrs.frozen(kw_only=True)
class InputWeightEqualizationDetector:
    """Recommends input-weight equalization where input and weight channel ranges disagree."""

    id: ClassVar[str] = "qinsight.equalization"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = EqualizationFinding

    ratio_threshold: float = attrs.field(default=0.5, validator=in_open_interval(0.0, 1.0))
    channel_fraction: float = attrs.field(default=0.4, validator=in_open_interval(0.0, 1.0))

    def _point(self, site: OpSite) -> InsertPoint:
        return InsertPoint.at(site, Side.PRE, per_channel=True)

    def _weight_point(self, site: OpSite) -> InsertPoint:
        return InsertPoint.at(site, Side.WEIGHT, per_channel=True, channel_axis=0)

    def insert_points(self, view: ModelView) -> tuple[InsertPoint, ...]:
        return tuple(point for site in view.sites for point in (self._point(site), self._weight_point(site)))

    def _finding(
        self, site: OpSite, stats: ActivationStats | None, weight: ActivationStats | None
    ) -> EqualizationFinding:
        input_ranges = _ranges(stats)
        weight_ranges = _ranges(weight)
        weight_global = weight.epoch_range if weight is not None else 0.0
        condition = DataCondition.NO_DATA if stats is None or weight is None or not weight.batches else stats.condition
        if condition is DataCondition.OK and len(input_ranges) != len(weight_ranges):
            raise ValueError(
                f"module {site.fqn}: its input has {len(input_ranges)} channels along axis "
                f"{site.channel_axis} but its weight reads {len(weight_ranges)}"
            )
        if condition is DataCondition.OK and weight_global == 0.0:
            condition = DataCondition.CONSTANT
        scores: tuple[float, ...] = ()
        if stats is not None and condition is DataCondition.OK:
            scores = _scores(input_ranges, stats.epoch_range, weight_ranges, weight_global)
        t = self.ratio_threshold
        recommended = tuple(c for c, s in enumerate(scores) if s < t or s > 1 / t)  # nan compares False
        return EqualizationFinding(
            fqn=site.fqn,
            kind=site.kind,
            ratio_threshold=t,
            channel_fraction=self.channel_fraction,
            condition=condition,
            input_ranges=input_ranges,
            weight_ranges=weight_ranges,
            scores=scores,
            recommended_channels=recommended,
            applicable=not (site.kind is OpKind.LINEAR and site.input_rank is not None and site.input_rank > 2),
        )

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        findings = tuple(
            self._finding(site, stats.for_point(self._point(site)), stats.for_point(self._weight_point(site)))
            for site in view.sites
        )
        suggestions = tuple(
            QuantSuggestion(fqn=f.fqn, equalize=f.recommended, sources=(self.id,))
            for f in findings
            if f.condition is DataCondition.OK and f.applicable
        )
        return result_of(self, findings, suggestions)
