"""Frozen activation statistics: what an observer knows after calibration.

:class:`ActivationStats` is torch-free and mergeable: the statistics of batches
A then B equal ``merge(stats(A), stats(B))`` (up to float summation order), so
calibration can be split across processes or machines.

Batches holding NaN or Inf are counted in ``nonfinite_batches`` and left out of
every other statistic: one bad batch must not turn every verdict into NaN.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence

import attrs

from qinsight.core.errors import InvalidValueError, MergeError
from qinsight.core.sites import InsertPoint, ObserverSpec, Side, called_module


class DataCondition(enum.Enum):
    """Whether an activation's statistics can carry a verdict."""

    OK = "ok"
    NO_DATA = "no_data"  # never ran, or every batch held NaN/Inf
    CONSTANT = "constant"  # the same single value in every batch


@attrs.frozen(kw_only=True)
class BatchMoments:
    """Sums of per-batch means and variances, for the variance-based stationarity.

    ``count`` batches contributed; ``mean_sum``/``mean_sq_sum`` are the sum of
    batch means and of their squares, ``var_sum``/``var_sq_sum`` likewise for
    the (population) batch variances.
    """

    count: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    mean_sum: float = 0.0
    mean_sq_sum: float = 0.0
    var_sum: float = 0.0
    var_sq_sum: float = 0.0

    def merge(self, other: BatchMoments) -> BatchMoments:
        return BatchMoments(
            count=self.count + other.count,
            mean_sum=self.mean_sum + other.mean_sum,
            mean_sq_sum=self.mean_sq_sum + other.mean_sq_sum,
            var_sum=self.var_sum + other.var_sum,
            var_sq_sum=self.var_sq_sum + other.var_sq_sum,
        )

    def stationarity(self) -> float | None:
        """The variance-based stationarity statistic, in [0, 1]; see docs/detectors.md.

        ``W`` is the mean within-batch variance, ``B`` the variance of the
        batch means and ``cv`` the coefficient of variation of the batch
        variances (the "variance of variance"). The statistic is
        ``W / (W + B) / (1 + cv)``: the share of the activation's total
        variance that a single batch sees, discounted when the batches'
        spread itself changes. Every term is an average over batches, so one
        outlier moves it by its share of the data instead of setting it, as an
        outlier sets the epoch range in ``S = mean batch range / epoch range``.
        ``None`` when undefined (no batches, or zero variance throughout).
        """
        if self.count == 0:
            return None
        n = self.count
        within = self.var_sum / n
        if within <= 0.0:
            return None
        between = max(0.0, self.mean_sq_sum / n - (self.mean_sum / n) ** 2)
        var_of_var = max(0.0, self.var_sq_sum / n - within**2)
        cv = math.sqrt(var_of_var) / within
        return within / (within + between) / (1.0 + cv)


def _counts(_instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
    # one min() over the tuple: deep_iterable(ge(0)) made two calls per channel, a third of freezing a large model
    if min(value, default=0) < 0:
        raise InvalidValueError(f"'{attribute.name}' must hold counts >= 0, not {min(value)}")


@attrs.frozen(kw_only=True)
class PercentileStats:
    """Per-channel ratios of the batch maximum to a reference percentile.

    For each batch and channel ``c`` with reference value ``q_p != 0`` (exact,
    "lower" interpolation as in torch) and at least half its values non-zero,
    ``max / q_p`` is added to ``ratio_sum[c]`` and ``measured_batches[c]``
    counts it. A dead or mostly-zero channel (e.g. behind a ReLU) is not
    measured in that batch: torch counts it, with a ratio of 3.4e38 when
    ``q_p`` is 0.
    ``constant_batches[c]`` counts batches where the channel held one value.
    """

    percentile: float
    ratio_sum: tuple[float, ...]
    measured_batches: tuple[int, ...] = attrs.field(validator=_counts)
    constant_batches: tuple[int, ...] = attrs.field(validator=_counts)

    def __attrs_post_init__(self) -> None:
        lengths = {len(self.ratio_sum), len(self.measured_batches), len(self.constant_batches)}
        if len(lengths) > 1:
            raise InvalidValueError(
                "ratio_sum, measured_batches and constant_batches must have one length per channel, not "
                f"{sorted(lengths)}"
            )

    def mean_ratios(self) -> tuple[float | None, ...]:
        """The mean ratio per channel, ``None`` where no batch could measure it."""
        return tuple(total / n if n else None for total, n in zip(self.ratio_sum, self.measured_batches))

    def merge(self, other: PercentileStats) -> PercentileStats:
        if other.percentile != self.percentile or len(other.ratio_sum) != len(self.ratio_sum):
            raise InvalidValueError("cannot merge percentile statistics of different percentiles or channel counts")
        return PercentileStats(
            percentile=self.percentile,
            ratio_sum=tuple(a + b for a, b in zip(self.ratio_sum, other.ratio_sum)),
            measured_batches=tuple(a + b for a, b in zip(self.measured_batches, other.measured_batches)),
            constant_batches=tuple(a + b for a, b in zip(self.constant_batches, other.constant_batches)),
        )


# LLM.int8() routes a feature to 16-bit when any of its values exceeds this magnitude.
LLM_INT8_THRESHOLD = 6.0
# A "massive activation" (Sun et al., 2024): a value this many times the median magnitude.
MASSIVE_FACTOR = 100.0


@attrs.frozen(kw_only=True)
class TailStats:
    """The heavy-tail statistics LLM quantization methods read, summed over batches (mergeable).

    Per channel: ``abs_sum`` (Σ|x|, over ``values`` values per channel: the mean
    |x| SmoothQuant and AWQ scale by), ``above`` (values with |x| >
    ``LLM_INT8_THRESHOLD``) and ``massive_hits`` (massive tokens whose largest
    value is in that channel). A *token* is one position: every value of one
    sample at one place along the other axes, across the channels; it is
    massive when its largest |x| exceeds ``MASSIVE_FACTOR`` times the batch's
    median |x|. ``power_sums`` are Σx, Σx², Σx³, Σx⁴ over all values, for the
    kurtosis.
    """

    values: int = attrs.field(validator=attrs.validators.ge(0))
    abs_sum: tuple[float, ...]
    above: tuple[int, ...] = attrs.field(validator=_counts)
    tokens: int = attrs.field(validator=attrs.validators.ge(0))
    massive_tokens: int = attrs.field(validator=attrs.validators.ge(0))
    massive_hits: tuple[int, ...] = attrs.field(validator=_counts)
    power_sums: tuple[float, float, float, float]

    def __attrs_post_init__(self) -> None:
        if not len(self.abs_sum) == len(self.above) == len(self.massive_hits):
            raise InvalidValueError("abs_sum, above and massive_hits must have one value per channel each")

    def mean_abs(self) -> tuple[float, ...]:
        return tuple(total / self.values if self.values else 0.0 for total in self.abs_sum)

    def kurtosis(self) -> float | None:
        """Pearson's kurtosis of all values (3 for a Gaussian; thousands with massive activations),
        None when undefined (no values, or one value throughout)."""
        n = self.values * len(self.abs_sum)
        if n == 0:
            return None
        m1, m2, m3, m4 = (total / n for total in self.power_sums)
        variance = m2 - m1 * m1
        if variance <= 0.0:
            return None
        return max(0.0, (m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1**4) / variance**2)

    def massive_channels(self) -> tuple[int, ...]:
        """The channels massive tokens peak in, most often first."""
        hit = [c for c, hits in enumerate(self.massive_hits) if hits]
        return tuple(sorted(hit, key=lambda c: -self.massive_hits[c]))

    def merge(self, other: TailStats) -> TailStats:
        if len(other.abs_sum) != len(self.abs_sum):
            raise InvalidValueError(
                f"cannot merge tail statistics of {len(self.abs_sum)} and {len(other.abs_sum)} channels"
            )
        return TailStats(
            values=self.values + other.values,
            abs_sum=tuple(a + b for a, b in zip(self.abs_sum, other.abs_sum)),
            above=tuple(a + b for a, b in zip(self.above, other.above)),
            tokens=self.tokens + other.tokens,
            massive_tokens=self.massive_tokens + other.massive_tokens,
            massive_hits=tuple(a + b for a, b in zip(self.massive_hits, other.massive_hits)),
            power_sums=(
                self.power_sums[0] + other.power_sums[0],
                self.power_sums[1] + other.power_sums[1],
                self.power_sums[2] + other.power_sums[2],
                self.power_sums[3] + other.power_sums[3],
            ),
        )


def _merge_percentiles(a: tuple[PercentileStats, ...], b: tuple[PercentileStats, ...]) -> tuple[PercentileStats, ...]:
    if not a or not b:  # one side saw no finite batch
        return a or b
    return tuple(x.merge(y) for x, y in zip(a, b))


def _merge_channels(
    a: tuple[float, ...] | None, b: tuple[float, ...] | None, pick: Callable[[float, float], float]
) -> tuple[float, ...] | None:
    if a is None:
        return b
    if b is None:
        return a
    if len(a) != len(b):
        raise InvalidValueError(f"cannot merge per-channel statistics of {len(a)} and {len(b)} channels")
    return tuple(pick(x, y) for x, y in zip(a, b))


@attrs.frozen(kw_only=True)
class FormatError:
    """A weight quantized in one torchao format as ``quantize_`` does it (one absmax scale per row or per
    group of inputs, round to nearest), and back: ``sqnr`` is the weight's power over the error's, in dB
    (``inf``: the format holds the weight exactly)."""

    format: str
    sqnr: float


@attrs.frozen(kw_only=True)
class ActivationStats:
    """Statistics of one observed activation over all calibration batches."""

    spec: ObserverSpec
    batches: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    nonfinite_batches: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    constant_batches: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    min: float = math.inf
    max: float = -math.inf
    batch_range_sum: float = 0.0
    channel_min: tuple[float, ...] | None = None
    channel_max: tuple[float, ...] | None = None
    moments: BatchMoments | None = None
    percentiles: tuple[PercentileStats, ...] = ()
    tails: TailStats | None = None
    # a weight side's error in each format its spec names that fits the weight (absent in files before 2.3)
    formats: tuple[FormatError, ...] = ()

    def format_error(self, name: str) -> FormatError | None:
        return next((error for error in self.formats if error.format == name), None)

    def __attrs_post_init__(self) -> None:
        if (self.channel_min is None) != (self.channel_max is None) or (
            self.channel_min is not None
            and self.channel_max is not None
            and len(self.channel_min) != len(self.channel_max)
        ):
            raise InvalidValueError(
                "channel_min and channel_max must both be absent or have one value per channel each"
            )
        channels = len(self.channel_min) if self.channel_min is not None else None
        if channels is not None and any(len(p.ratio_sum) != channels for p in self.percentiles):
            raise InvalidValueError(f"percentile statistics must have one value per channel ({channels})")
        if channels is not None and self.tails is not None and len(self.tails.abs_sum) != channels:
            raise InvalidValueError(f"tail statistics must have one value per channel ({channels})")

    def percentile_stats(self, percentile: float) -> PercentileStats | None:
        return next((p for p in self.percentiles if p.percentile == percentile), None)

    @property
    def condition(self) -> DataCondition:
        if self.batches == 0:
            return DataCondition.NO_DATA
        if self.max == self.min:
            return DataCondition.CONSTANT
        return DataCondition.OK

    @property
    def epoch_range(self) -> float:
        return self.max - self.min if self.batches else 0.0

    @property
    def mean_batch_range(self) -> float:
        return self.batch_range_sum / self.batches if self.batches else 0.0

    def batch_to_epoch_ratio(self) -> float | None:
        """torch's stationarity statistic S = mean batch range / epoch range.

        ``None`` where torch raises or returns garbage: no data (torch: -0.0)
        and a constant activation (torch: ``ValueError``).
        """
        if self.condition is not DataCondition.OK:
            return None
        return self.mean_batch_range / self.epoch_range

    def merge(self, other: ActivationStats) -> ActivationStats:
        """The statistics of both halves' batches together."""
        if other.spec != self.spec:
            raise InvalidValueError(f"cannot merge statistics of different specs: {self.spec} vs {other.spec}")
        moments = self.moments
        if other.moments is not None:
            moments = other.moments if moments is None else moments.merge(other.moments)
        tails = self.tails
        if other.tails is not None:
            tails = other.tails if tails is None else tails.merge(other.tails)
        return ActivationStats(
            spec=self.spec,
            batches=self.batches + other.batches,
            nonfinite_batches=self.nonfinite_batches + other.nonfinite_batches,
            constant_batches=self.constant_batches + other.constant_batches,
            min=min(self.min, other.min),
            max=max(self.max, other.max),
            batch_range_sum=self.batch_range_sum + other.batch_range_sum,
            channel_min=_merge_channels(self.channel_min, other.channel_min, min),
            channel_max=_merge_channels(self.channel_max, other.channel_max, max),
            moments=moments,
            percentiles=_merge_percentiles(self.percentiles, other.percentiles),
            tails=tails,
            formats=self.formats or other.formats,  # one weight, measured alike by every shard
        )


@attrs.frozen(kw_only=True)
class Observation:
    """The statistics of the observer at ``key`` (``fc1:pre``)."""

    key: str
    fqn: str
    side: Side
    stats: ActivationStats


@attrs.frozen(kw_only=True)
class ObservedStats:
    """All observations of one calibration, looked up by what a detector asked for."""

    observations: tuple[Observation, ...]

    def get(self, fqn: str, side: Side, channel_axis: int) -> ActivationStats | None:
        """The statistics observed at ``side`` of ``fqn`` along ``channel_axis`` (a later call's weight:
        its module's, observed once at the first call, :meth:`InsertPoint.at`)."""
        if side is Side.WEIGHT:
            fqn = called_module(fqn)
        for observation in self.observations:
            stats = observation.stats
            if observation.fqn == fqn and observation.side is side and stats.spec.channel_axis == channel_axis:
                return stats
        return None

    def for_point(self, point: InsertPoint) -> ActivationStats | None:
        """The statistics of the observer that served ``point``."""
        return self.get(point.fqn, point.side, point.spec.channel_axis)

    @classmethod
    def merged(cls, shards: Sequence[ObservedStats]) -> ObservedStats:
        """The statistics of all ``shards``' batches together (calibrations of one model on disjoint data).

        Observations are matched by key, in the order first seen; one that only
        some shards hold (a data-dependent model's branch) merges over those.
        Weight observations are no data: every shard must hold the same, or the
        shards ran different weights (:class:`MergeError`).
        """
        merged: dict[str, Observation] = {}
        for shard in shards:
            for observation in shard.observations:
                known = merged.get(observation.key)
                merged[observation.key] = observation if known is None else _merge_observation(known, observation)
        return cls(observations=tuple(merged.values()))


def _merge_observation(known: Observation, other: Observation) -> Observation:
    if (known.fqn, known.side) != (other.fqn, other.side) or known.stats.spec != other.stats.spec:
        raise MergeError(
            f"observation {known.key}: the shards observed it differently ({known.stats.spec} vs {other.stats.spec})"
        )
    if known.side is Side.WEIGHT:
        if known.stats != other.stats:
            raise MergeError(f"the weight of {known.fqn} differs between shards: they ran different models or weights")
        return known
    return attrs.evolve(known, stats=known.stats.merge(other.stats))
