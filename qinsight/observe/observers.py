"""The diagnostic observer: the one mutable object, folding calibration batches into its state.

An :class:`ActivationObserver` sees every calibration batch of one activation. Its forward
measures the batch (:func:`qinsight.observe.batch.measure`: one pass for the range statistics it
always keeps, plus only what its :class:`ObserverSpec` asks for) and keeps the measurement, one flat
tensor, until a few are pending (at most :data:`PENDING_BYTES`); those are summarized together and
folded into the state, in place, on the activation's device. Nothing is read on the host until
:meth:`ActivationObserver.freeze`, which returns immutable :class:`ActivationStats`. State is
O(channels) whatever the number of batches.
"""

from __future__ import annotations

import torch
from torch import nn

from qinsight.core.errors import ObserverError
from qinsight.core.sites import ObserverSpec
from qinsight.core.stats import ActivationStats, BatchMoments, PercentileStats, TailStats
from qinsight.observe.batch import Layout, channels_of, measure, summarize
from qinsight.observe.sampling import BatchClock, ColumnSampler

# Measurements an observer keeps before summarizing them: about 16 batches of a tensor observed
# per channel at width 4,096 (a dozen ops for all of them instead of a dozen each), and one batch
# at a time of the LLM-sized tails and percentiles, whose measurement alone is larger.
PENDING_BYTES = 2**20


class ActivationObserver(nn.Module):
    """Accumulates :class:`ActivationStats` over calibration batches."""

    def __init__(self, spec: ObserverSpec, key: str, clock: BatchClock | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.key = key
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        self._calls = 0  # batches folded, finite or not
        self._pending: list[torch.Tensor] = []  # measurements not yet summarized
        self._state: torch.Tensor | None = None  # the running extrema and sums, laid out as a summary
        self._layout = Layout(self.spec, 0)
        self._sampler = ColumnSampler(self.spec.percentile_samples, self.clock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.observe(x)
        return x

    def observe(self, x: torch.Tensor) -> None:
        """Fold one batch into the statistics."""
        measured = self.measure(x)
        if measured is not None:
            self.fold(measured)

    def measure(self, x: torch.Tensor) -> torch.Tensor | None:
        """What the batch ``x`` adds to the statistics (None: nothing to observe); the state is not touched."""
        return measure(x, self.spec, self._sampler)

    def fold(self, measured: torch.Tensor) -> None:
        """Adds one batch's measurement (:meth:`measure`) to the statistics; no op runs until a few are pending."""
        if self._calls == 0:
            self._layout = Layout(self.spec, channels_of(self.spec, measured))
        elif measured.numel() != self._layout.measured_size:
            raise ObserverError(
                f"observer {self.key}: a batch has {channels_of(self.spec, measured)} channels along axis "
                f"{self.spec.channel_axis}, earlier batches had {self._layout.channels}"
            )
        self._pending.append(measured)
        self._calls += 1
        if len(self._pending) * measured.numel() * measured.element_size() >= PENDING_BYTES:
            self._summarize()

    def _summarize(self) -> None:
        """Folds the pending measurements into the state: a minimum over the extrema, an add over the sums."""
        if not self._pending:
            return
        summary = summarize(self._pending, self._layout)
        self._pending = []
        if self._state is None:
            self._state = summary
            return
        extrema = self._layout.extrema
        torch.minimum(self._state[:extrema], summary[:extrema], out=self._state[:extrema])
        self._state[extrema:].add_(summary[extrema:])

    @property
    def state(self) -> torch.Tensor | None:
        """The running state, laid out as a summary (extrema, then sums); None before a batch."""
        self._summarize()
        return self._state

    def state_bytes(self) -> int:
        """Bytes of the state kept between batches, once the pending measurements are folded in: O(channels),
        whatever the number of batches (the pending ones never exceed :data:`PENDING_BYTES`)."""
        state = self.state
        return 0 if state is None else state.numel() * state.element_size()

    def freeze(self) -> ActivationStats:
        """The statistics so far, as an immutable value: the one place the state is read on the host."""
        layout, state = self._layout, self.state
        values = [] if state is None else state.tolist()
        batches = round(values[layout.sums["batches"]]) if values else 0
        if batches == 0:  # no batch, or every batch held NaN or Inf
            return ActivationStats(
                spec=self.spec, nonfinite_batches=self._calls, moments=BatchMoments() if self.spec.moments else None
            )
        sums = {name: values[index] for name, index in layout.sums.items()}
        channel_min = channel_max = None
        if layout.channels:
            channel_min = tuple(values[2 : 2 + layout.channels])
            channel_max = tuple(-v for v in values[2 + layout.channels : layout.extrema])
        return ActivationStats(
            spec=self.spec,
            batches=batches,
            nonfinite_batches=self._calls - batches,
            constant_batches=round(sums["constant"]),
            min=values[0],
            max=-values[1],
            batch_range_sum=-sums["negative_span"],
            channel_min=channel_min,
            channel_max=channel_max,
            moments=self._moments(sums, batches),
            percentiles=tuple(_percentile_stats(p, layout, values) for p in self.spec.percentiles),
            tails=_tail_stats(sums, layout, values) if self.spec.tails else None,
        )

    def _moments(self, sums: dict[str, float], batches: int) -> BatchMoments | None:
        if not self.spec.moments:
            return None
        return BatchMoments(
            count=batches,
            mean_sum=sums["mean"],
            mean_sq_sum=sums["mean_sq"],
            var_sum=sums["var"],
            var_sq_sum=sums["var_sq"],
        )

    def extra_repr(self) -> str:
        return f"key={self.key!r}, spec={self.spec}"


def _counts(row: list[float]) -> tuple[int, ...]:
    return tuple(round(v) for v in row)


def _percentile_stats(percentile: float, layout: Layout, values: list[float]) -> PercentileStats:
    return PercentileStats(
        percentile=percentile,
        ratio_sum=tuple(layout.row(values, f"ratio@{percentile!r}")),
        measured_batches=_counts(layout.row(values, f"measured@{percentile!r}")),
        constant_batches=_counts(layout.row(values, f"constant@{percentile!r}")),
    )


def _tail_stats(sums: dict[str, float], layout: Layout, values: list[float]) -> TailStats:
    count = round(sums["values"])
    return TailStats(
        values=count,
        abs_sum=tuple(layout.row(values, "abs_sum")),
        above=_counts(layout.row(values, "above")),
        tokens=count,  # a token is one position across the channels: as many as values per channel
        massive_tokens=round(sums["massive"]),
        massive_hits=_counts(layout.row(values, "hits")),
        power_sums=(sums["s1"], sums["s2"], sums["s3"], sums["s4"]),
    )


__all__ = ["ActivationObserver", "BatchClock"]
