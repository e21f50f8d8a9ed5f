"""Activation outliers per channel (torch's OutlierDetector, with dead and sparse channels kept apart).

Observes the input of every Linear and Conv with a reference percentile ``p``.
Per channel, the ratio is the mean over batches of ``max / p-th percentile``
(exact, "lower" interpolation), over the batches where that percentile is not
zero; torch's fix-up follows (``r < 0 -> -r``, then ``r < 1 -> 1 / r``). A
channel is an outlier channel when its ratio exceeds ``ratio_threshold``.

Channels without data to measure get their own status and never count as
outliers. torch gives them a ratio of inf or 3.4e38 and flags them: 1,311
channels of a random ResNet-18. The statuses are ``dead`` (zero in every batch),
``constant`` (one value throughout) and ``sparse``. A channel is sparse when
it was measurable (reference percentile non-zero, at least half its values
non-zero: :data:`qinsight.observe.batch.MIN_NONZERO_SHARE`) in fewer than
``fraction_batches_used_threshold`` of the informative batches, as behind a
ReLU; there a low reference makes ``max / percentile`` huge without any
outlier. Informative batches are those where the activation
was not one constant value, so an all-zero batch does not make every channel
sparse. torch only reports the share as ``is_sufficient_batches``.

The finding also gives the LLM.int8() view: the largest absolute activation,
and the channels whose magnitude exceeds ``magnitude_threshold`` (6.0, the
threshold bitsandbytes uses to route a feature to 16-bit).

A Linear with outlier channels gets a suggestion of dynamic activations: a
static scale either spans the outliers or clips them; a dynamic one takes each
batch's range. FX and PT2E have no dynamic convolutions, so convs get none.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, ClassVar

import attrs

from qinsight.core.findings import Finding
from qinsight.core.report import DetectorResult
from qinsight.core.sites import InsertPoint, OpKind, OpSite, Side
from qinsight.core.stats import (
    LLM_INT8_THRESHOLD,
    MASSIVE_FACTOR,
    ActivationStats,
    DataCondition,
    ObservedStats,
    PercentileStats,
    TailStats,
)
from qinsight.core.suggestions import ActivationMode, QuantSuggestion
from qinsight.detectors._validators import in_open_interval, positive, positive_or_none
from qinsight.plugin.detector import API_VERSION, result_of

if TYPE_CHECKING:
    from qinsight.plugin.detector import ModelView


class ChannelStatus(enum.Enum):
    OK = "ok"
    OUTLIER = "outlier"
    DEAD = "dead"
    CONSTANT = "constant"
    SPARSE = "sparse"


def fix_up(ratio: float) -> float:
    """torch's correction for a negative reference or a ratio below 1."""
    ratio = abs(ratio)
    return 1.0 / ratio if 0.0 < ratio < 1.0 else ratio


@attrs.frozen(kw_only=True)
class OutlierFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = ("no calibration data", "outlier channels", "no outliers")

    kind: OpKind
    ratio_threshold: float
    reference_percentile: float
    magnitude_threshold: float
    condition: DataCondition
    batches: int
    statuses: tuple[ChannelStatus, ...]
    ratios: tuple[float, ...]  # fixed-up mean ratio per channel; nan where not measured
    constant_batches: tuple[int, ...]
    channel_abs_max: tuple[float, ...]
    # What LLM methods read (Linear inputs; absent where not observed): docs/detectors.md
    tails: TailStats | None = None

    @property
    def kurtosis(self) -> float | None:
        return None if self.tails is None else self.tails.kurtosis()

    @property
    def massive_channels(self) -> tuple[int, ...]:
        """The channels the massive tokens peak in, most often first."""
        return () if self.tails is None else self.tails.massive_channels()

    @property
    def int8_outlier_channels(self) -> tuple[int, ...]:
        """Channels with values above LLM.int8()'s 6.0, most such values first."""
        if self.tails is None:
            return ()
        above = self.tails.above
        return tuple(sorted((c for c, n in enumerate(above) if n), key=lambda c: -above[c]))

    def channels(self, status: ChannelStatus) -> tuple[int, ...]:
        return tuple(c for c, s in enumerate(self.statuses) if s is status)

    @property
    def outlier_channels(self) -> tuple[int, ...]:
        return self.channels(ChannelStatus.OUTLIER)

    @property
    def magnitude_channels(self) -> tuple[int, ...]:
        """Channels with ``|x| > magnitude_threshold`` somewhere (LLM.int8()'s outlier features)."""
        return tuple(c for c, m in enumerate(self.channel_abs_max) if m > self.magnitude_threshold)

    @property
    def max_abs(self) -> float:
        return max(self.channel_abs_max, default=0.0)

    @property
    def verdict(self) -> str:
        if self.condition is DataCondition.NO_DATA:
            return "no calibration data"
        return "outlier channels" if self.outlier_channels else "no outliers"

    @property
    def actionable(self) -> bool:
        return bool(self.outlier_channels) or self.condition is DataCondition.NO_DATA

    def severity(self) -> float | None:
        """The worst outlier channel's ratio."""
        found = [self.ratios[c] for c in self.outlier_channels if math.isfinite(self.ratios[c])]
        return max(found) if found else None

    def reason(self) -> str:
        if self.condition is DataCondition.NO_DATA:
            return "no finite activation reached it"
        parts = []
        outliers = self.outlier_channels
        if outliers:
            worst = max(outliers, key=lambda c: self.ratios[c])
            parts.append(
                f"{len(outliers)}/{len(self.statuses)} channels with max/p{self.reference_percentile * 100:g} > "
                f"{self.ratio_threshold:g} (worst {self.ratios[worst]:.1f}, channel {worst})"
            )
        magnitude = self.magnitude_channels
        above = f", {len(magnitude)} channels above {self.magnitude_threshold:g}" if magnitude else ""
        parts.append(f"max |x| {self.max_abs:.3g}{above}")
        unmeasured = [
            f"{len(self.channels(status))} {status.value}"
            for status in (ChannelStatus.DEAD, ChannelStatus.CONSTANT, ChannelStatus.SPARSE)
            if self.channels(status)
        ]
        if unmeasured:
            parts.append("not measurable: " + ", ".join(unmeasured))
        if self.tails is not None and self.tails.values:
            parts.append(_tails_text(self.tails))
        return "; ".join(parts)


def _tails_text(tails: TailStats) -> str:
    kurtosis = tails.kurtosis()
    text = "kurtosis " + ("n/a" if kurtosis is None else f"{kurtosis:.3g}")
    above = sum(tails.above)
    if above:
        text += f", {above} values above {LLM_INT8_THRESHOLD:g} in {sum(1 for n in tails.above if n)} channels"
    if tails.massive_tokens:
        channels = ", ".join(str(c) for c in tails.massive_channels()[:3])
        massive = f"{tails.massive_tokens}/{tails.tokens} massive tokens"
        text += f", {massive} (> {MASSIVE_FACTOR:g}x median |x|, channel {channels})"
    return text


@attrs.frozen(kw_only=True)
class OutlierDetector:
    """Finds input channels whose maximum is far beyond their typical values."""

    id: ClassVar[str] = "qinsight.outliers"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = OutlierFinding

    ratio_threshold: float = attrs.field(default=3.5, validator=positive(minimum=1.0))
    reference_percentile: float = attrs.field(default=0.975, validator=in_open_interval(0.0, 1.0))
    fraction_batches_used_threshold: float = attrs.field(
        default=0.95, validator=in_open_interval(0.0, 1.0, closed_high=True)
    )
    magnitude_threshold: float = attrs.field(default=6.0, validator=positive(minimum=0.0))
    channel_axis: int | None = None  # None: the kind's channel axis (last for Linear, 1 for Conv)
    # Percentiles from this many samples per channel of a batch holding at least twice as many (None: exact);
    # see qinsight.observe.sampling.ColumnSampler for the error bound.
    percentile_samples: int | None = attrs.field(default=16384, validator=positive_or_none(minimum=1.0))
    # Mean |x|, values above 6, kurtosis and massive tokens at Linear inputs (what LLM methods read)
    tails: bool = True

    def _point(self, site: OpSite) -> InsertPoint:
        return InsertPoint.at(
            site,
            Side.PRE,
            percentile=self.reference_percentile,
            percentile_samples=self.percentile_samples,
            channel_axis=self.channel_axis,
            tails=self.tails and site.kind is OpKind.LINEAR,
        )

    def insert_points(self, view: ModelView) -> tuple[InsertPoint, ...]:
        return tuple(self._point(site) for site in view.sites)

    def _status(self, lo: float, hi: float, measured_share: float, ratio: float) -> ChannelStatus:
        if lo == hi:
            return ChannelStatus.DEAD if hi == 0.0 else ChannelStatus.CONSTANT
        if measured_share < self.fraction_batches_used_threshold or math.isnan(ratio):
            return ChannelStatus.SPARSE
        return ChannelStatus.OUTLIER if ratio > self.ratio_threshold else ChannelStatus.OK

    def _finding(self, site: OpSite, stats: ActivationStats | None) -> OutlierFinding:
        percentile = None if stats is None else stats.percentile_stats(self.reference_percentile)
        if stats is None or percentile is None or stats.channel_min is None or stats.channel_max is None:
            # No finite batch reached the module: a finding without channels.
            lows: tuple[float, ...] = ()
            highs: tuple[float, ...] = ()
            condition, batches = DataCondition.NO_DATA, 0
            percentile = PercentileStats(
                percentile=self.reference_percentile, ratio_sum=(), measured_batches=(), constant_batches=()
            )
        else:
            condition, batches, lows, highs = stats.condition, stats.batches, stats.channel_min, stats.channel_max
        ratios = tuple(math.nan if m is None else fix_up(m) for m in percentile.mean_ratios())
        informative = max(1, batches - (stats.constant_batches if stats is not None else 0))
        shares = tuple(n / informative for n in percentile.measured_batches)
        return OutlierFinding(
            fqn=site.fqn,
            kind=site.kind,
            ratio_threshold=self.ratio_threshold,
            reference_percentile=self.reference_percentile,
            magnitude_threshold=self.magnitude_threshold,
            condition=condition,
            batches=batches,
            statuses=tuple(self._status(lo, hi, share, r) for lo, hi, share, r in zip(lows, highs, shares, ratios)),
            ratios=ratios,
            constant_batches=percentile.constant_batches,
            channel_abs_max=tuple(max(abs(lo), abs(hi)) for lo, hi in zip(lows, highs)),
            tails=None if stats is None else stats.tails,
        )

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        findings = [self._finding(site, stats.for_point(self._point(site))) for site in view.sites]
        suggestions = [
            QuantSuggestion(fqn=f.fqn, activation=ActivationMode.DYNAMIC, sources=(self.id,))
            for f in findings
            if f.kind is OpKind.LINEAR and f.outlier_channels
        ]
        return result_of(self, findings, suggestions)
