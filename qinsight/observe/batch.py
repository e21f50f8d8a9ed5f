"""One calibration batch measured: the observers' hot path, on the activation's device, with no host reads.

:func:`measure` turns a batch into one flat float64 tensor whatever the spec asks for (a
:class:`Layout` says where each statistic lies), so folding it into an observer's state, which
has the same layout, is one ``torch.minimum`` over the extrema part and one ``add_`` over the sums:

- the extrema: ``[min, -max]`` of the batch, then per channel the minima and the negated maxima
  (negated so that one minimum folds both);
- the sums: every scalar and per-channel quantity the statistics add up over batches.

Nothing here reads a tensor's value on the host: a GPU never waits for the CPU, and the CPU
queues work without waiting for the GPU. A batch holding NaN or Inf is not skipped by a Python
branch (that would read a value): its summary is the neutral element of the fold (``+inf``
extrema, zero sums), chosen on the device by one ``torch.where``, and the observer counts it as
non-finite at freeze (calls minus finite batches).
"""

from __future__ import annotations

import functools

import torch

from qinsight.core.sites import ObserverSpec
from qinsight.observe.sampling import ColumnSampler, sampled_view
from qinsight.observe.scratch import SCRATCH
from qinsight.observe.selection import channel_percentile, channel_view
from qinsight.observe.tails import TAIL_CHANNEL_ROWS, TAIL_SUMS, batch_tails, centred_sums, raw_power_sums


class Layout:
    """Where each statistic of a spec lies in a batch's summary (and an observer's state) for ``channels``
    channels (0 when the spec is not per channel): the extrema first, then the sums, then the per-channel rows."""

    def __init__(self, spec: ObserverSpec, channels: int) -> None:
        sums = ["batches", "constant", "negative_span"]
        if spec.moments:
            sums += ["mean", "var", "mean_sq", "var_sq"]
        if spec.tails:
            sums += list(TAIL_SUMS)
        rows = [f"{field}@{p!r}" for p in spec.percentiles for field in ("ratio", "measured", "constant")]
        if spec.tails:
            rows += list(TAIL_CHANNEL_ROWS)
        self.channels = channels
        self.extrema = 2 + 2 * channels
        self.sums = {name: self.extrema + i for i, name in enumerate(sums)}
        first_row = self.extrema + len(sums)
        self.rows = {name: first_row + i * channels for i, name in enumerate(rows)}
        self.size = first_row + len(rows) * channels

    def row(self, values: list[float], name: str) -> list[float]:
        """The per-channel row ``name`` of a summary or state read as ``values``."""
        first = self.rows[name]
        return values[first : first + self.channels]


@functools.lru_cache(maxsize=256)
def _neutral(device: torch.device, extrema: int, size: int) -> torch.Tensor:
    """A non-finite batch's summary: extrema that no minimum keeps, sums that add nothing."""
    inf = torch.full((extrema,), torch.inf, dtype=torch.float64, device=device)
    return torch.cat((inf, torch.zeros(size - extrema, dtype=torch.float64, device=device)))


def channels_of(spec: ObserverSpec, summary: torch.Tensor) -> int:
    """How many channels a batch's ``summary`` was measured with (0 when ``spec`` is not per channel)."""
    if not spec.per_channel:
        return 0
    fixed = Layout(spec, 0)
    return (summary.numel() - fixed.size) // (2 + len(fixed.rows))


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
    rows: list[torch.Tensor] = []  # flattened per-channel rows, in Layout order
    if spec.per_channel:
        channel_min, channel_max = channel_extrema(x, spec.channel_axis)
        channel_ends = torch.stack((channel_min, channel_max.neg()))
        ends = channel_ends.amin(dim=1)
        extrema = [ends, channel_ends.reshape(-1)]
        if spec.percentiles:
            rows.append(_percentile_rows(x, spec, sampler, channel_min, channel_max).reshape(-1))
        channels = channel_min.numel()
    else:
        low, high = torch.aminmax(x)
        ends = torch.stack((low, high.neg()))
        extrema, channels = [ends], 1
    negative_span = ends.sum(0, keepdim=True, dtype=torch.float64)  # min - max, in float64: it cannot overflow
    # NaN spreads to the min and max and Inf shows in them; either makes min - max NaN or -inf
    finite = negative_span.isfinite()
    parts = [*extrema, finite, negative_span == 0, negative_span]
    if spec.tails:
        massive, tail_rows = batch_tails(x, spec.channel_axis)  # first: it uses the work buffer as |x|
        rows.append(tail_rows.reshape(-1))
    if spec.moments or spec.tails:
        mean, central = centred_sums(x, 4 if spec.tails else 2)
        if spec.moments:
            moments = torch.stack((mean, central[0] / x.numel()))  # the batch's mean and population variance
            parts += [moments, moments.square()]
        if spec.tails:
            parts += [massive.new_full((1,), x.numel() // channels), massive, raw_power_sums(x.numel(), mean, central)]
    summary = torch.cat(parts + rows)  # float64: the sums' type, to which the rest is promoted exactly
    neutral = _neutral(summary.device, sum(part.numel() for part in extrema), summary.numel())
    return torch.where(finite, summary, neutral)


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
