"""The switches a simulation puts where the prepared graph has observers, and the fake quantization
they apply: static with the observer's qparams, dynamic per batch, or off (:class:`Mode`)."""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch
from torch import nn

_RANGES = {torch.quint8: (0, 255), torch.qint8: (-128, 127), torch.uint8: (0, 255), torch.int8: (-128, 127)}


class Mode(enum.Enum):
    """How a site runs in the simulation."""

    FLOAT = "float"
    STATIC = "static"
    DYNAMIC = "dynamic"  # weights quantized, the input quantized per batch, the output left in float


class Switch(nn.Module):
    """An observer turned into a fake quantizer that can be turned off (``mode``) or made dynamic.

    ``dynamic_max`` is the top of a dynamic activation's range (127 where fbgemm reduces it);
    ``aten``: quantize as ATen's ``quantize_per_tensor`` does (FX's converted model), which rounds a
    few values differently from fake quantization (PT2E's decomposed quantize rounds as it does);
    ``weight``: gives the constant a weight observer reads, fake-quantized once here (read only
    where this switch quantizes).
    """

    def __init__(
        self,
        observer: nn.Module,
        *,
        dynamic_max: int = 255,
        aten: bool = False,
        weight: Callable[[], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.mode = Mode.STATIC
        dtype = getattr(observer, "dtype", torch.float32)
        self.passthrough = dtype not in _RANGES or bool(getattr(observer, "is_dynamic", False))
        self.qmin, self.qmax = _RANGES.get(dtype, (0, 255))
        self.axis: int | None = None
        self.scale, self.zero_point = torch.ones(1), torch.zeros(1, dtype=torch.int32)
        if not self.passthrough:
            scale, zero_point = observer.calculate_qparams()  # type: ignore[operator]
            self.scale, self.zero_point = scale.float().reshape(-1), zero_point.int().reshape(-1)
            if self.scale.numel() > 1:
                self.axis = int(getattr(observer, "ch_axis", 0))
        # per-tensor qparams as numbers, read once: not a tensor-to-number sync on every batch
        self.step, self.zero = float(self.scale[0]), int(self.zero_point[0])
        self._calibrated = (self.step, self.zero)
        self.dynamic_max, self.aten, self.dtype = dynamic_max, aten, dtype
        # a weight's fake-quantized value, computed once (after the rounding rule above is set)
        self.constant = self.quantize(weight()) if weight is not None and not self.passthrough else None

    def regroup(self, qparams: tuple[float, int] | None) -> None:
        """Quantize with ``qparams`` (per tensor) from now on; ``None``: with the observer's own."""
        if self.axis is None and not self.passthrough:
            self.step, self.zero = qparams if qparams is not None else self._calibrated

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        if self.mode is Mode.FLOAT:
            return value
        if self.mode is Mode.DYNAMIC or self.passthrough:
            return dynamic_fake_quantize(value, self.dynamic_max) if self.mode is Mode.DYNAMIC else value
        if self.constant is not None:
            return self.constant
        return self.quantize(value)

    def quantize(self, value: torch.Tensor) -> torch.Tensor:
        if self.axis is not None:
            return torch.fake_quantize_per_channel_affine(
                value, self.scale, self.zero_point, self.axis, self.qmin, self.qmax
            )
        if self.aten:
            return self.quantized(value).dequantize()
        return torch.fake_quantize_per_tensor_affine(value, self.step, self.zero, self.qmin, self.qmax)

    @property
    def static_per_tensor(self) -> bool:
        """Whether the value leaving this switch is a per-tensor quantized one (a kernel can read it)."""
        return self.mode is Mode.STATIC and not self.passthrough and self.axis is None and self.constant is None

    def quantized(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` as the quantized tensor a real kernel reads (exact for a value this switch let out)."""
        return torch.quantize_per_tensor(value, self.step, self.zero, self.dtype)


def dynamic_fake_quantize(value: torch.Tensor, quant_max: int = 255) -> torch.Tensor:
    """Per-tensor affine quantization to ``0..quant_max`` with this tensor's own range, as dynamic
    kernels do (fbgemm's reduce their range to 7 bits: ``quant_max=127``)."""
    low, high = torch.aminmax(value.detach())
    low_value, high_value = min(float(low), 0.0), max(float(high), 0.0)
    scale = max((high_value - low_value) / quant_max, 1e-8)
    zero_point = int(round(-low_value / scale))
    return torch.fake_quantize_per_tensor_affine(value, scale, min(max(zero_point, 0), quant_max), 0, quant_max)


def fake_quantized_weight(weight: torch.Tensor, per_channel: bool) -> torch.Tensor:
    """Symmetric int8 weights, per output channel or per tensor (the x86 flows' weight schemes)."""
    w = weight.detach()
    if per_channel:
        bound = w.abs().reshape(w.shape[0], -1).amax(dim=1).clamp_min(1e-12)
        scale = (bound / 127.5).float()
        zero = torch.zeros_like(scale, dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(w, scale, zero, 0, -128, 127)
    step = max(float(w.abs().max()) / 127.5, 1e-12)
    return torch.fake_quantize_per_tensor_affine(w, step, 0, -128, 127)


def fake_quantized_rows(weight: torch.Tensor) -> torch.Tensor:
    """Affine 8-bit weights with a float scale and offset per row: embeddings' float-qparams scheme."""
    w = weight.detach()
    low = w.amin(dim=1, keepdim=True)
    scale = ((w.amax(dim=1, keepdim=True) - low) / 255.0).clamp_min(1e-8)
    return torch.clamp(torch.round((w - low) / scale), 0, 255) * scale + low
