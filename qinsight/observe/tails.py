"""The heavy-tail statistics of one activation batch (:class:`~qinsight.core.stats.TailStats`) and
the centred power sums behind both the kurtosis and the batch moments, on the observers' hot path.

Mean |x| and the count above LLM.int8()'s 6 per channel, the massive tokens (a position whose
largest |x| is 100 times the batch's median |x|) with the channels they peak in, and Σx..Σx⁴.
Every count is a comparison written as 0/1 into a float buffer and summed: on the CPU a float
sum of that is 4x faster than summing the comparison's booleans (torch 2.13), and on any device it
is one pass whatever the values, where restricting the count to the channels that reach 6 needed
their number on the host.
"""

from __future__ import annotations

import functools
import math

import torch

from qinsight.core.stats import LLM_INT8_THRESHOLD, MASSIVE_FACTOR
from qinsight.observe.scratch import SCRATCH
from qinsight.observe.selection import channel_view

# Where :func:`batch_tails`' results lie in a batch summary (qinsight.observe.batch.Layout).
TAIL_SUMS = ("values", "massive", "s1", "s2", "s3", "s4")
TAIL_CHANNEL_ROWS = ("abs_sum", "above", "hits")

MEDIAN_SAMPLES = 4096  # values the batch's median |x| is taken from: a massive value is 100x it


def _sample_step(numel: int, channels: int) -> int:
    """A stride of about ``numel / MEDIAN_SAMPLES`` that is coprime with the channel count, so an
    evenly strided sample of a channels-last tensor visits every channel, not a few of them."""
    step = max(1, numel // MEDIAN_SAMPLES)
    while step > 1 and math.gcd(step, channels) != 1:
        step -= 1
    return step


def batch_tails(x: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tail statistics of one batch, channels along ``axis``: the massive tokens' count (1,) and
    the (3, channels) rows ``abs_sum``, ``above``, ``hits`` (:data:`TAIL_CHANNEL_ROWS`), float32.

    A token peaking in several channels at once (a tie at its largest |x|) counts in each.
    """
    view = channel_view(x, axis)  # (before, channels, after): a view, nothing copied
    magnitude = torch.abs(view, out=SCRATCH.shaped(view, "work"))  # contiguous, whatever the view's layout
    flags = SCRATCH.shaped(view, "flags")
    abs_sum = magnitude.sum(dim=(0, 2))
    above = torch.gt(magnitude, LLM_INT8_THRESHOLD, out=flags).sum(dim=(0, 2))
    flat = magnitude.reshape(-1)
    median = flat[:: _sample_step(flat.numel(), view.shape[1])].median()
    peak = magnitude.amax(dim=1, keepdim=True)  # per token (before, 1, after)
    massive = peak > MASSIVE_FACTOR * median
    bar = torch.where(massive, peak, torch.inf)  # a token's peak where it is massive, else unreachable
    hits = torch.ge(magnitude, bar, out=flags).sum(dim=(0, 2))
    return massive.sum(dtype=torch.float64).reshape(1), torch.stack((abs_sum, above, hits))


def centred_sums(x: torch.Tensor, powers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's mean (float64, computed in float32) and Σ(x - mean)^k for k = 2..``powers`` (float64).

    Raw powers summed in float32 lose the central moments to cancellation when the mean is large
    against the spread: values near -500 with a spread of 100 gave a kurtosis off by 1e-4 (a
    hypothesis example). Centred in float32, they keep it. One buffer holds (x - mean)², and the
    odd power is a flat BLAS dot: Σ(x - mean)³ = Σ(x - mean)² x - mean Σ(x - mean)².
    """
    flat = x.reshape(-1)  # copied only where x is strided
    mean = flat.sum() / flat.numel()
    squares = torch.sub(flat, mean, out=SCRATCH.shaped(flat, "work")).square_()
    second = squares.sum()
    if powers == 2:
        return mean.double(), second.double().reshape(1)
    central = torch.stack((second, torch.dot(squares, flat) - mean * second, torch.dot(squares, squares)))
    return mean.double(), central.double()


@functools.lru_cache(maxsize=8)
def _expansion(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per device, made once (a host-to-device copy on the first batch only): the exponents and
    binomial weights that expand centred sums into raw ones."""
    exponents = torch.arange(5, dtype=torch.float64, device=device)
    order = torch.tensor([[max(k - j, 0) for j in range(5)] for k in range(1, 5)], device=device)
    weights = torch.tensor(
        [[float(math.comb(k, j)) if j <= k else 0.0 for j in range(5)] for k in range(1, 5)],
        dtype=torch.float64,
        device=device,
    )
    return exponents, order, weights


def raw_power_sums(n: int, mean: torch.Tensor, central: torch.Tensor) -> torch.Tensor:
    """Σx, Σx², Σx³, Σx⁴ (float64, (4,)) of ``n`` values from their ``mean`` and centred sums
    Σ(x - mean)^2..4: Σx^k = Σ_j C(k, j) mean^(k-j) c_j, with c_0 = n and c_1 = 0."""
    exponents, order, weights = _expansion(mean.device)
    powers = torch.pow(mean, exponents)  # mean^0 .. mean^4
    centred = torch.nn.functional.pad(central, (2, 0))  # c_0, c_1 = 0 here; c_0 = n enters below
    return (weights * powers[order]) @ centred + n * powers[1:]
