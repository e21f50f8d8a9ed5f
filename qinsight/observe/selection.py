"""Exact per-channel percentiles by selection, pruned with block maxima.

The outlier statistic needs a high percentile (97.5th) of every channel of
every calibration batch. ``torch.quantile`` sorts each channel; ``topk`` of
the upper tail is a selection, but still reads every value through a slow
per-row routine. Most values can be ruled out first, exactly:

Split each channel's ``n`` values into blocks of ``b`` and take each block's
maximum (one fast, vectorised pass). Let ``T`` be the k-th largest block
maximum. The k blocks holding the k largest maxima contain at least k values
``>= T``, and every value ``> T`` lies in one of them. So the k-th largest
value of the channel is the k-th largest value of those k blocks: selection
then runs on ``n/b`` maxima and ``k*b`` candidates instead of ``n`` values
(about a third, for the 97.5th percentile), and ties cannot break it.

Blocks are taken along whichever dimension keeps them contiguous in memory,
so channels-last activations (Linear inputs) are never transposed whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

# Blocks only pay off when the candidates are a small share of the values.
_MAX_CANDIDATE_SHARE = 0.5
_MAX_BLOCK = 16


def lower_rank(percentile: float, n: int) -> int:
    """The 0-based ascending index of the ``percentile`` ("lower" interpolation) of ``n`` values.

    Computed in float32 as ``torch.quantile`` computes it for a float32 ``q``,
    so ties at a rank boundary resolve as in torch.
    """
    return math.floor(float(np.float32(percentile) * np.float32(n - 1)))


def channel_view(x: torch.Tensor, axis: int) -> torch.Tensor:
    """``x`` as (before, channels, after): a view for contiguous ``x``, no data moved."""
    axis %= x.ndim
    before = math.prod(x.shape[:axis])
    return x.reshape(before, x.shape[axis], -1)


def channel_percentile(x: torch.Tensor, percentile: float, axis: int = 0) -> torch.Tensor:
    """The exact ``percentile`` of each channel of ``x`` along ``axis``, "lower" interpolation.

    Equal to ``torch.quantile(..., interpolation="lower")`` over every other
    dimension, without its 2^24-element limit.
    """
    view = channel_view(x, axis)
    n = view.shape[0] * view.shape[2]
    rank = lower_rank(percentile, n)
    above = n - rank  # values at or above the rank, counting the rank itself
    if above <= rank + 1:
        return kth_largest(view, above)
    return -kth_largest(-view, rank + 1)


def kth_largest(view: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest value of each channel of a (before, channels, after) view."""
    before, channels, after = view.shape
    blocks = candidate_blocks(view, k)
    if blocks is None:  # blocks do not pay: select among all values (a copy)
        return _select(view.transpose(0, 1).reshape(channels, before * after), k)
    maxima, candidates_of = blocks
    top = top_blocks(maxima, k)
    return _select(candidates_of(top), k)


def _select(rows: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest value of each row."""
    if _numpy_selects(rows):
        values = np.partition(rows.contiguous().numpy(), rows.shape[1] - k, axis=1)[:, rows.shape[1] - k]
        return torch.from_numpy(values)
    return torch.topk(rows, k, dim=1, sorted=False).values.amin(dim=1)


# Rows up to this long select faster in numpy, at any thread count: torch.topk's
# per-row cost dominates there. Measured with two threads (torch 2.13, CPU): the
# 97.5th percentile of (1024, 384) and (1024, 1536) Linear inputs, whose pruned rows
# hold 130-220 values, 1.04 -> 0.67 and 4.9 -> 3.5 ms; of (8, 64, 56, 56) conv
# inputs sampled to 16,384, rows of about 2,500, numpy took 4.6 ms to topk's 3.6.
NUMPY_ROW = 1024


def _numpy_selects(values: torch.Tensor) -> bool:
    """Whether numpy selects among the rows of ``values`` (:func:`_in_numpy`), when its rows are short or
    torch runs one thread. numpy's introselect is single-threaded and 2x faster than torch.topk on one
    thread; on long rows of values topk splits the rows over threads and wins."""
    return _in_numpy(values) and (values.shape[-1] <= NUMPY_ROW or torch.get_num_threads() == 1)


def _in_numpy(values: torch.Tensor) -> bool:
    """Whether numpy can work on ``values`` in place: a CPU tensor of a dtype numpy has (not bfloat16)."""
    return values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64, torch.float16)


def top_blocks(maxima: torch.Tensor, k: int) -> torch.Tensor:
    """(channels, k) indices of each channel's k largest block maxima, from (channels, blocks) ``maxima``.

    Any k blocks whose maxima are at least the k-th largest do: the chosen blocks hold k values at least as
    large, and every larger value lies in one of them, so ties between maxima may be broken anyhow.
    """
    if _in_numpy(maxima):  # at any row length: see below
        rows = maxima.contiguous().numpy()
        blocks = rows.shape[1]
        if blocks <= SHORT_BLOCK_ROW:
            # Short rows: a value selection and a comparison beat numpy's argpartition, which moves an index
            # along with each value; the comparison picks exactly k blocks unless the k-th maximum is tied.
            chosen = rows >= np.partition(rows, blocks - k, axis=1)[:, blocks - k : blocks - k + 1]
            if (chosen.sum(axis=1) == k).all():
                return torch.from_numpy((np.flatnonzero(chosen) % blocks).reshape(-1, k))
        # Long rows, or ties (a ReLU's dead channels, whose maxima are all 0): argpartition, at any row length
        # faster than torch.topk of indices (0.23 against 1.0 ms for 3 rows of 57,344; 0.11 against 0.33 ms
        # for 512 rows of 56: the benchmark CNN's conv inputs).
        return torch.from_numpy(np.argpartition(rows, blocks - k, axis=1)[:, blocks - k :])
    return torch.topk(maxima, k, dim=1, sorted=False).indices


# Rows of block maxima up to this long pick their top blocks by value selection and a comparison
# (0.34 against 0.48 ms for 384 rows of 256, 1.5 against 2.0 ms for 1,536); longer rows by
# argpartition (0.37 against 0.93 ms for 64 rows of 3,584). torch 2.13, numpy 2, two threads.
SHORT_BLOCK_ROW = 512


def _block_size(length: int, n: int, k: int) -> int | None:
    """A block size dividing ``length`` near the optimum sqrt(n/k), if blocks pay off."""
    ideal = round(math.sqrt(n / k))
    for b in sorted(range(2, _MAX_BLOCK + 1), key=lambda b: abs(b - ideal)):
        if length % b == 0 and k * b <= _MAX_CANDIDATE_SHARE * n:
            return b
    return None


Candidates = Callable[[torch.Tensor], torch.Tensor]


def candidate_blocks(view: torch.Tensor, k: int) -> tuple[torch.Tensor, Candidates] | None:
    """Each channel's block maxima (channels, blocks), and the function giving the (channels, k*b)
    values of chosen blocks (channels, k): these hold each channel's k largest. None to use all values.

    ``view`` may be strided (a slice of channels, a transposed sample): blocks are
    views of it and candidates are gathered by advanced indexing where they lie, so
    no copy of the view is made. (Gathering by flat offsets computed from the
    strides cost 4x more: the int64 offset tensors are as large as the candidates.)
    """
    before, channels, after = view.shape
    n = before * after
    channel = torch.arange(channels, device=view.device).view(channels, 1)
    if after > 1:
        # Conv inputs and channel rows. Block j of a row is every m-th value from
        # j: a reduction across contiguous slices, 10x faster than over a short
        # trailing dim.
        b = _block_size(after, n, k)
        if b is None:
            return None
        m = after // b
        strided_blocks = view.reshape(before, channels, b, m)
        maxima = strided_blocks.amax(dim=2)  # (before, channels, m)

        def strided(top: torch.Tensor) -> torch.Tensor:
            # top indexes a channel's (before, m) maxima flattened; the slice keeps each block's b values
            return strided_blocks[top // m, channel, :, top.remainder(m)].reshape(channels, k * b)

        return maxima.transpose(0, 1).reshape(channels, -1), strided
    # Channels last (Linear inputs): a block is `size` consecutive rows.
    size = _block_size(before, n, k)
    if size is None:
        return None
    row_blocks = view.reshape(before // size, size, channels)

    def rows(top: torch.Tensor) -> torch.Tensor:
        return row_blocks[top, :, channel].reshape(channels, k * size)

    return row_blocks.amax(dim=1).t(), rows
