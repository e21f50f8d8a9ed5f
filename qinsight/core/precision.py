"""How many bits one per-tensor scale leaves a part of a tensor: the statistic behind the precision
and range-conflict detectors, here for plugins too (``qinsight.plugin``).

A part (a channel, an operand) spanning ``part range`` of a scale spanning
``tensor range`` gets ``bits - log2(tensor range / part range)`` of the
activation's bits: below a few, values a step apart collapse to one level.
"""

from __future__ import annotations

import math
import statistics

import attrs

from qinsight.core.backend import get_backend
from qinsight.core.sites import Side
from qinsight.core.stats import ActivationStats, DataCondition


def activation_bits(backend: str, *, torch_default: bool = False) -> int:
    """The bits of a static activation in qinsight's configs: 8 for every backend (its FX config
    observes x86 and fbgemm activations at 8 bits too, checked on the kernels:
    :mod:`qinsight.core.fx_activations`); with ``torch_default``, torch's default FX config's: 7 for
    x86 and fbgemm (their records' ``reduced_range``)."""
    return 7 if torch_default and get_backend(backend).reduced_range else 8


def bits_kept(bits: int, tensor_range: float, part_range: float) -> float:
    """The bits a part (a channel, an operand) spanning ``part_range`` gets of a scale spanning ``tensor_range``."""
    if tensor_range <= 0.0:
        return float(bits)  # one value: nothing to lose
    if part_range <= 0.0:
        return -math.inf
    return bits - math.log2(tensor_range / part_range)


def quantized_range(stats: ActivationStats) -> float:
    """The range a min/max observer gives: it always includes zero."""
    return max(stats.max, 0.0) - min(stats.min, 0.0)


@attrs.frozen(kw_only=True)
class SideBits:
    """One observed tensor of an op: its range, its median channel's, and the bits that channel keeps."""

    side: Side
    tensor_range: float
    median_channel_range: float
    widest_channel: int
    widest_channel_range: float
    bits_kept: float
    # Of the channels that vary, how many span less than one step of the scale: their values
    # collapse to one or two levels (absent in files before 1.6: 0 of 0)
    channels: int = 0
    collapsed_channels: int = 0


def side_bits(side: Side, stats: ActivationStats | None, bits: int) -> SideBits | None:
    if (
        stats is None
        or stats.condition is DataCondition.NO_DATA
        or stats.channel_min is None
        or stats.channel_max is None
    ):
        return None
    ranges = [hi - lo for lo, hi in zip(stats.channel_min, stats.channel_max)]
    # Constant channels (one token type everywhere) need no levels: the median is over the others.
    live = [r for r in ranges if r > 0.0]
    median = statistics.median(live) if live else 0.0
    widest = max(range(len(ranges)), key=ranges.__getitem__)
    tensor = quantized_range(stats) if live else 0.0
    step = tensor / (2**bits - 1)
    return SideBits(
        side=side,
        tensor_range=tensor,
        median_channel_range=median,
        widest_channel=widest,
        widest_channel_range=ranges[widest],
        bits_kept=bits_kept(bits, tensor, median),
        channels=len(live),
        collapsed_channels=sum(1 for r in live if r < step),
    )


__all__ = ["SideBits", "activation_bits", "bits_kept", "quantized_range", "side_bits"]
