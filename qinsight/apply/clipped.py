"""An FX activation observer that sees a layer's output as the clip after it leaves it.

FX shares one observer between a layer and the ReLU6 (hardtanh) reading it, and
that observer sees the values before the clip: on MobileNetV2 a conv's output
spans about [-20, 30] while ReLU6 keeps [0, 6], so the kept values get a few of
the scale's levels, and the zero point lands mid-range, where fbgemm's
depthwise kernels saturate their 16-bit sums at 8 bits. Observing the clipped
values gives the range PT2E's fused conv-ReLU6 observer gets; quantizing with
it clips as the ReLU6 does, so the model computes the same.

It belongs on a layer whose input FX observes elsewhere (its producer is
quantized): FX makes a layer's *input* observer from the layer's own qconfig
too where nothing observes the input yet, and clipping an input is wrong.
:func:`~qinsight.apply.qconfigs.advice_entries` only sets it there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.ao.quantization.observer import HistogramObserver

from qinsight.core.errors import InvalidParameterError


class ClippedHistogramObserver(HistogramObserver):
    """torch's ``HistogramObserver`` on ``x.clamp(lower, upper)``; passes ``x`` through unchanged."""

    def __init__(self, lower: float = 0.0, upper: float = 6.0, **kwargs: Any) -> None:
        if not lower < upper:
            raise InvalidParameterError("ClippedHistogramObserver", "upper", upper, f"lower < upper (lower={lower})")
        super().__init__(**kwargs)
        self.lower, self.upper = float(lower), float(upper)

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() > 0:
            super().forward(x_orig.detach().clamp(self.lower, self.upper))
        return x_orig

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}"


__all__ = ["ClippedHistogramObserver"]
