"""The diagnostic observer: the one mutable object, folding each calibration batch into its state.

An :class:`ActivationObserver` sees every calibration batch of one activation. Its forward
measures the batch (:func:`qinsight.observe.batch.measure`: one pass for the range statistics it
always keeps, plus only what its :class:`ObserverSpec` asks for) and folds that measurement, one
flat tensor, into its state, in place, on the activation's device. Nothing is read on
the host until :meth:`ActivationObserver.freeze`, which returns immutable :class:`ActivationStats`.
State is O(channels) whatever the number of batches.
"""

from __future__ import annotations


import torch
from torch import nn

from qinsight.core.errors import ObserverError
from qinsight.core.sites import ObserverSpec
from qinsight.core.stats import ActivationStats, BatchMoments, PercentileStats, TailStats
from qinsight.observe.batch import Layout, channels_of, measure
from qinsight.observe.sampling import BatchClock, ColumnSampler


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
        self._state: torch.Tensor | None = None  # the running extrema and sums, laid out as a batch's summary
        self._layout = Layout(self.spec, 0)
        self._sampler = ColumnSampler(self.spec.percentile_samples, self.clock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.observe(x)
        return x

    def observe(self, x: torch.Tensor) -> None:
        """Fold one batch into the statistics."""
        summary = self.measure(x)
        if summary is not None:
            self.fold(summary)

    def measure(self, x: torch.Tensor) -> torch.Tensor | None:
        """What the batch ``x`` adds to the statistics (None: nothing to observe); the state is not touched."""
        return measure(x, self.spec, self._sampler)

    def fold(self, summary: torch.Tensor) -> None:
        """Adds one batch's summary (:meth:`measure`) to the statistics: two in-place ops on the device."""
        if self._state is None:
            self._state = summary.clone()
            self._layout = Layout(self.spec, channels_of(self.spec, summary))
            self._extrema, self._sums = self._state[: self._layout.extrema], self._state[self._layout.extrema :]
        elif summary.shape != self._state.shape:
            raise ObserverError(
                f"observer {self.key}: a batch has {channels_of(self.spec, summary)} channels along axis "
                f"{self.spec.channel_axis}, earlier batches had {self._layout.channels}"
            )
        else:
            extrema = self._layout.extrema
            torch.minimum(self._extrema, summary[:extrema], out=self._extrema)
            self._sums.add_(summary[extrema:])
        self._calls += 1

    @property
    def state(self) -> torch.Tensor | None:
        """The running state, laid out as a batch's summary (extrema, then sums); None before a batch."""
        return self._state

    def state_bytes(self) -> int:
        """Bytes of the state kept between batches: O(channels), whatever the number of batches."""
        return 0 if self._state is None else self._state.numel() * self._state.element_size()

    def freeze(self) -> ActivationStats:
        """The statistics so far, as an immutable value: the one place the state is read on the host."""
        layout = self._layout
        values = [] if self._state is None else self._state.tolist()
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
            count=batches, mean_sum=sums["mean"], mean_sq_sum=sums["mean_sq"], var_sum=sums["var"], var_sq_sum=sums["var_sq"]
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
