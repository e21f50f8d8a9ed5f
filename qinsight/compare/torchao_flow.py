"""torchao's ``quantize_`` as a flow: int8 Linears, static or dynamic, calibrated like the other flows.

``quantize_`` swaps each Linear's weight for a torchao tensor subclass and needs no graph, so it takes
any model, those FX cannot trace and ``torch.export`` cannot export too. Its int8 configs:
``Int8DynamicActivationInt8WeightConfig`` (activations quantized per token as they come) and
``Int8StaticActivationInt8WeightConfig`` (one activation scale, fixed before the model runs). A static
scale has to be measured, so an :class:`Int8Recipe` is prepared as the other flows are: a copy of
the model whose static Linears observe their inputs' largest magnitude (one running ``amax`` per
Linear, no host sync), calibrated on the user's batches, then converted: the scales computed and
``quantize_`` applied with one ``FqnToConfig``. A torchao config of the user's own is applied when
prepared (nothing to calibrate). torchao is an optional extra, imported when a model is quantized.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import torch
from torch import nn

from qinsight.core.errors import MissingExtraError

INSTALL_HINT = "the torchao flow needs torchao: pip install 'qinsight[pt2e]'"
_STATE = "_qinsight_int8_recipe"  # what a prepared copy carries to its convert


@attrs.frozen
class Int8Layer:
    """One Linear's int8 config: activations per batch (``dynamic``) or at a calibrated scale, weights
    per output channel or per tensor."""

    fqn: str
    dynamic: bool
    per_channel: bool = True


@attrs.frozen
class Int8Recipe:
    """The Linears to quantize to int8 and how; every other module stays float."""

    layers: tuple[Int8Layer, ...]


def is_torchao_config(config: object) -> bool:
    """Whether ``config`` is what the torchao flow takes: an :class:`Int8Recipe` or one of torchao's
    ``quantize_`` configs (``AOBaseConfig``: known by its class's package, torchao being optional)."""
    if isinstance(config, Int8Recipe):
        return True
    return any(c.__name__ == "AOBaseConfig" and c.__module__.startswith("torchao.") for c in type(config).__mro__)


class _InputRange:
    """A forward pre-hook keeping the largest |x| a Linear's input reached, and the input's rank (a
    static scale has as many dimensions as the input it scales)."""

    def __init__(self) -> None:
        self.amax: torch.Tensor | None = None
        self.rank = 2

    def __call__(self, _module: nn.Module, inputs: tuple[Any, ...]) -> None:
        x = inputs[0].detach()
        seen = torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32)  # max |x| in one reduction
        self.amax = seen if self.amax is None else torch.maximum(self.amax, seen)
        self.rank = x.dim()


def prepare_torchao(model: nn.Module, config: object, *_ignored: Any) -> nn.Module:
    """A copy of ``model``: with an :class:`Int8Recipe`, its static Linears observing their inputs; with a
    torchao config of one's own, quantized by ``quantize_`` at once."""
    quantization = torchao_quantization()
    copied = copy.deepcopy(model).eval()
    if not isinstance(config, Int8Recipe):
        quantization.quantize_(copied, config)
        return copied
    modules = dict(copied.named_modules())
    layers = [layer for layer in config.layers if isinstance(modules.get(layer.fqn), nn.Linear)]
    observers = {layer.fqn: _InputRange() for layer in layers if not layer.dynamic}
    hooks = [modules[fqn].register_forward_pre_hook(observer) for fqn, observer in observers.items()]
    setattr(copied, _STATE, (tuple(layers), observers, hooks))
    return copied


def convert_torchao(prepared: nn.Module) -> nn.Module:
    """``prepared`` quantized: each recipe Linear by ``quantize_`` with its config, a static one at the
    scale its inputs' calibrated range gives (symmetric int8); one never run stays float."""
    state = prepared.__dict__.pop(_STATE, None)
    if state is None:  # the user's own config, applied when prepared
        return prepared
    layers, observers, hooks = state
    for hook in hooks:
        hook.remove()
    configs = {layer.fqn: _config(layer, observers.get(layer.fqn)) for layer in layers}
    chosen = {fqn: config for fqn, config in configs.items() if config is not None}
    if chosen:
        quantization = torchao_quantization()
        quantization.quantize_(prepared, quantization.FqnToConfig(fqn_to_config=chosen), filter_fn=None)
    return prepared


def _config(layer: Int8Layer, observed: _InputRange | None) -> Any:
    quantization = torchao_quantization()
    from torchao.quantization.granularity import PerRow, PerTensor

    weights = PerRow() if layer.per_channel else PerTensor()
    if layer.dynamic:
        return quantization.Int8DynamicActivationInt8WeightConfig(granularity=[PerRow(), weights])
    if observed is None or observed.amax is None:
        return None
    scale = (observed.amax.clamp_min(torch.finfo(torch.float32).tiny) / 127).reshape((1,) * observed.rank)
    return quantization.Int8StaticActivationInt8WeightConfig(act_quant_scale=scale, granularity=[PerTensor(), weights])


def torchao_quantization() -> Any:
    """``torchao.quantization``, or one :class:`MissingExtraError` naming the extra."""
    try:
        import torchao.quantization as quantization
    except ImportError as exc:
        raise MissingExtraError(f"{INSTALL_HINT} ({exc})") from exc
    return quantization


__all__ = [
    "INSTALL_HINT",
    "Int8Layer",
    "Int8Recipe",
    "convert_torchao",
    "is_torchao_config",
    "prepare_torchao",
    "torchao_quantization",
]
