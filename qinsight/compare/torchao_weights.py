"""Layers quantized by torchao's ``quantize_``: the weight is a tensor subclass holding the integers
and their scales, and the module stays a plain ``nn.Linear`` (or conv).

torchao is an optional extra, so nothing here imports it: a weight is recognized by its class's
module and by the ``dequantize`` every one of its quantized tensor classes has. The format is read
from the subclass's own attributes (``Int8Tensor``: per-row int8, with the activations quantized
per batch where ``act_quant_kwargs`` is set; ``IntxUnpackedToInt8Tensor``: the int type and the
group size of ``block_size``).
"""

from __future__ import annotations

from typing import Any, TypeGuard

import torch


def is_torchao_weight(weight: object) -> TypeGuard[torch.Tensor]:
    """Whether ``weight`` is one of torchao's quantized tensor subclasses (``quantize_``'s weights)."""
    return (
        isinstance(weight, torch.Tensor)
        and f"{type(weight).__module__}.".startswith("torchao.")
        and callable(getattr(weight, "dequantize", None))
    )


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """The float weight a torchao quantized weight computes with (its integers times their scales):
    a plain tensor, which torch's own ops accept (the subclass refuses even ``view``)."""
    value: torch.Tensor = weight.dequantize()
    return value.as_subclass(torch.Tensor) if type(value) is not torch.Tensor else value


def format_of(weight: torch.Tensor) -> str:
    """What a torchao quantized weight is, in words: ``int8 weight-only, per row``, ``int4 weight-only,
    groups of 32``, ``int8 dynamic activations, int8 weights, per row``, ``int8 static activations, ...``;
    else its class's name."""
    name = type(weight).__name__
    bits = _bits(weight)
    if bits is None:
        return f"torchao {name}"
    grouping = _grouping(weight)
    markers = ("act_quant_kwargs", "activation_quantization")  # the two ways torchao's subclasses hold it
    quantizes_inputs = any(getattr(weight, name, None) is not None for name in markers)
    static = getattr(weight, "act_quant_scale", None) is not None  # one scale, calibrated before the model ran
    inputs = ("int8 static activations, " if static else "int8 dynamic activations, ") if quantizes_inputs else ""
    weights = f"{bits} weights" if quantizes_inputs else f"{bits} weight-only"
    return f"{inputs}{weights}{', ' + grouping if grouping else ''} (torchao {name})"


def _bits(weight: Any) -> str | None:
    target = getattr(weight, "target_dtype", None)
    if isinstance(target, torch.dtype):
        return str(target).removeprefix("torch.")
    if type(weight).__name__ == "Int8Tensor":
        return "int8"
    return None


def _grouping(weight: Any) -> str:
    """The granularity of the scales from ``block_size`` (one scale per block of the weight)."""
    block = getattr(weight, "block_size", None)
    if block is None or len(block) != 2:
        return ""
    rows, columns = (int(v) for v in block)
    if rows == 1 and columns == weight.shape[-1]:
        return "per row"
    if rows == 1:
        return f"groups of {columns}"
    return f"blocks of {rows}x{columns}"


__all__ = ["dequantized", "format_of", "is_torchao_weight"]
