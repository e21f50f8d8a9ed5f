"""One calibration batch measured: the observers' hot path, on the activation's device, with no host reads.

:func:`measure` turns a batch into one flat tensor (a :class:`Layout` says where each statistic
lies): its extrema, with the maxima negated so that one minimum folds both, then every sum the
spec asks for. It runs the passes over the data and nothing else: a tensor observed for its
range alone costs 3 ops (``aminmax``, a negation, a ``cat``), one observed per channel 4.
:func:`summarize` turns the measurements of a few batches, stacked, into one float64 summary,
the finiteness of each batch, its span and the masking included, in a dozen ops whatever their
number: the observer folds that into its state (:mod:`qinsight.observe.observers`).

Nothing here reads a tensor's value on the host: a GPU never waits for the CPU, and the CPU
queues work without waiting for the GPU.
"""

from __future__ import annotations

import torch

from qinsight.core.sites import ObserverSpec
from qinsight.observe.sampling import ColumnSampler, sampled_view
from qinsight.observe.scratch import SCRATCH
from qinsight.observe.selection import channel_percentile, channel_view
from qinsight.observe.tails import TAIL_CHANNEL_ROWS, TAIL_SUMS, batch_tails, centred_sums, raw_power_sums


class Layout:
    """Where each statistic of a spec lies, for ``channels`` channels (0 when the spec is not per channel).

    A batch's *measurement* (:func:`measure`) holds the extrema (``[min, -max]``, or per channel the
    minima then the negated maxima), the spec's sums, then its per-channel rows. A *summary* of one
    or more batches (:func:`summarize`), and an observer's state, hold the extrema (``[min, -max]``
    then, per channel, the minima and the negated maxima), the bookkeeping sums (finite batches,
    constant ones, min - max), the spec's sums, then the rows.
    """

    def __init__(self, spec: ObserverSpec, channels: int) -> None:
        sums = []
        if spec.moments:
            sums += ["mean", "var", "mean_sq", "var_sq"]
        if spec.tails:
            sums += list(TAIL_SUMS)
        rows = [f"{field}@{p!r}" for p in spec.percentiles for field in ("ratio", "measured", "constant")]
        if spec.tails:
            rows += list(TAIL_CHANNEL_ROWS)
        self.channels = channels
        self.spec_sums = len(sums)
        self.channel_width = 2 + len(rows)  # a measurement's values per channel: its minimum, -maximum and rows
        self.measured_ends = 2 * channels if channels else 2
        self.measured_size = self.measured_ends + len(sums) + len(rows) * channels
        self.extrema = 2 + 2 * channels
        self.sums = {name: self.extrema + i for i, name in enumerate([*BOOKKEEPING, *sums])}
        first_row = self.extrema + len(self.sums)
        self.rows = {name: first_row + i * channels for i, name in enumerate(rows)}
        self.size = first_row + len(rows) * channels

    def row(self, values: list[float], name: str) -> list[float]:
        """The per-channel row ``name`` of a summary or state read as ``values``."""
        first = self.rows[name]
        return values[first : first + self.channels]


BOOKKEEPING = ("batches", "constant", "negative_span")  # what a summary adds up from the measured extrema


def channels_of(spec: ObserverSpec, measured: torch.Tensor) -> int:
    """How many channels a batch was ``measured`` with (0 when ``spec`` is not per channel)."""
    if not spec.per_channel:
        return 0
    fixed = Layout(spec, 0)
    return (measured.numel() - fixed.spec_sums) // fixed.channel_width


# A channel's percentile is measured in a batch only when at least this share of its values
# is non-zero: the reference percentile p of all values is then at least the (2p - 1)
# percentile of the non-zero ones (95th for p = 0.975). In a sparser channel (mostly zeros
# behind a ReLU) it sits low in the live values and max / percentile is large without any outlier.
MIN_NONZERO_SHARE = 0.5

# Percentile work runs over groups of channels of about this many values, so what it
# allocates on top of the activation stays bounded whatever its size: a few MB on the CPU
# (the caches), more on an accelerator, where each group costs a dozen kernel launches.
CHUNK_VALUES = {"cpu": 2**20}
DEVICE_CHUNK_VALUES = 2**24


def channel_extrema(x: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel (min, max) of ``x`` along ``axis``, reducing every other dim."""
    dims = tuple(d for d in range(x.ndim) if d != axis % x.ndim)
    if not dims:  # an unbatched 1-D input: each value is its own channel (amin over () would reduce all)
        return x, x
    # amin and amax read x in place. Moving the axis first would copy the
    # activation, and torch.aminmax(dim=0) on channels-last data measured 10x
    # slower than these two reductions (torch 2.13, CPU).
    return x.amin(dim=dims), x.amax(dim=dims)


def measure(x: object, spec: ObserverSpec, sampler: ColumnSampler) -> torch.Tensor | None:
    """What the batch ``x`` adds to the statistics of ``spec`` (None: nothing to observe)."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return None
    with torch.no_grad():
        return _measure(_as_float(x), spec, sampler)  # no_grad: x need not be detached


def _as_float(x: torch.Tensor) -> torch.Tensor:
    # Sums of bfloat16 or counts in half precision lose integers above 256: measure in float32.
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _measure(x: torch.Tensor, spec: ObserverSpec, sampler: ColumnSampler) -> torch.Tensor:
    """The batch's extrema, the spec's sums and rows, as one flat tensor (:class:`Layout`); the bookkeeping
    that needs no pass over the data (finite? constant? the span) waits for :func:`summarize`."""
    rows: list[torch.Tensor] = []  # flattened per-channel rows, in Layout order
    if spec.per_channel:
        channel_min, channel_max = channel_extrema(x, spec.channel_axis)
        parts = [channel_min, channel_max.neg()]
        if spec.percentiles:
            rows.append(_percentile_rows(x, spec, sampler, channel_min, channel_max).reshape(-1))
    else:
        low, high = torch.aminmax(x)
        parts = [torch.stack((low, high.neg()))]
    if spec.tails:
        massive, tail_rows = batch_tails(x, spec.channel_axis)  # first: it uses the work buffer as |x|
        rows.append(tail_rows.reshape(-1))
    if spec.moments or spec.tails:
        mean, central = centred_sums(x, 4 if spec.tails else 2)
        if spec.moments:
            moments = torch.stack((mean, central[0] / x.numel()))  # the batch's mean and population variance
            parts += [moments, moments.square()]
        if spec.tails:
            values = x.numel() // parts[0].numel()  # per channel (tails imply per_channel: parts[0] is the minima)
            parts += [massive.new_full((1,), values), massive, raw_power_sums(x.numel(), mean, central)]
    return torch.cat(parts + rows)  # the widest type of its parts: float64 where there are sums


def summarize(measured: list[torch.Tensor], layout: Layout) -> torch.Tensor:
    """The float64 summary (:class:`Layout`) of one or more batches' measurements: a dozen ops whatever
    their number, so observers measure batch after batch and summarize a few batches at a time.

    A batch holding NaN or Inf is not skipped by a Python branch (that would read a value on the
    host): ``torch.where`` gives it extrema that no minimum keeps and sums that add nothing.
    """
    batches = torch.stack(measured).double()  # (batches, measured size)
    ends = channel_ends = batches[:, : layout.measured_ends]
    if layout.channels:  # per channel [minima, -maxima]: the batch's [min, -max] is their least
        ends = channel_ends.view(-1, 2, layout.channels).amin(dim=2)
    negative_span = ends.sum(dim=1)  # min - max: NaN spreads to the min and max, Inf shows in them
    finite = negative_span.isfinite().unsqueeze(1)
    extrema = torch.cat((ends, channel_ends), dim=1) if layout.channels else ends
    sums = torch.cat((negative_span.unsqueeze(1), batches[:, layout.measured_ends :]), dim=1)
    counts = torch.cat((finite, negative_span.unsqueeze(1) == 0), dim=1)
    return torch.cat(
        (
            torch.where(finite, extrema, torch.inf).amin(dim=0),
            counts.sum(dim=0, dtype=torch.float64),  # finite batches (all NaN-free), constant ones
            torch.where(finite, sums, 0.0).sum(dim=0),
        )
    )


def _percentile_rows(
    x: torch.Tensor, spec: ObserverSpec, sampler: ColumnSampler, channel_min: torch.Tensor, channel_max: torch.Tensor
) -> torch.Tensor:
    """Per percentile of ``spec``, the rows ratio, measured, constant (:func:`percentile_ratios`), as
    one (3 x percentiles, channels) tensor computed over groups of channels (bounded scratch memory)."""
    channels = channel_min.numel()
    view = channel_view(x, spec.channel_axis)  # a view of the activation: nothing copied
    columns = sampler.columns(view.shape[0] * view.shape[2], x.device)
    per_channel = view.shape[0] * view.shape[2] if columns is None else columns.numel()
    step = max(1, CHUNK_VALUES.get(x.device.type, DEVICE_CHUNK_VALUES) // per_channel)
    groups = []
    for first in range(0, channels, step):
        part = slice(first, min(first + step, channels))
        whole = step >= channels  # one group: no slicing, each slice being one more op per batch
        chunk = sampled_view(view if whole else view[:, part], columns)
        nonzero = torch.ne(chunk, 0, out=SCRATCH.shaped(chunk, "flags")).sum(dim=(0, 2))
        dense = nonzero >= MIN_NONZERO_SHARE * per_channel
        low, high = (channel_min, channel_max) if whole else (channel_min[part], channel_max[part])
        blocks = [percentile_ratios(chunk, p, dense, low, high) for p in spec.percentiles]
        groups.append(blocks[0] if len(blocks) == 1 else torch.cat(blocks))
    return groups[0] if len(groups) == 1 else torch.cat(groups, dim=1)


def percentile_ratios(
    view: torch.Tensor, percentile: float, dense: torch.Tensor, batch_min: torch.Tensor, batch_max: torch.Tensor
) -> torch.Tensor:
    """Per channel of a (before, channels, after) ``view``, three rows: max / percentile (0 where not
    measured), whether it was measured (a non-zero reference in a ``dense`` channel), whether the channel
    held one value; in the view's float type, the flags as 0 and 1."""
    reference = channel_percentile(view, percentile, 1)
    measured = (reference != 0) & dense
    ratio = torch.where(measured, batch_max / reference, 0.0)  # in x's float type, as torch computes it
    return torch.stack((ratio, measured, batch_max == batch_min))
