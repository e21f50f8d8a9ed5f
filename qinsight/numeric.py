"""Float vs quantized, layer by layer (the Numeric Suite's job), with typed results.

Layers are matched by the float model's module names, which ``convert_fx``
keeps. A BatchNorm that directly follows a conv in the float model is folded
into the float weight first, because the quantized conv absorbed it:
comparing the unfolded weight would measure the fold, not quantization.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.ao.nn.intrinsic.modules.fused import _FusedModule

from qinsight.comparison import ChannelMetric, LayerWeightComparison, MetricValue, WeightComparison
from qinsight.frontends.eager import _candidates
from qinsight.frontends.fx import _Tracer
from qinsight.metrics import MetricFn, load_metrics


def _batchnorm_after_conv(model: nn.Module) -> dict[str, str]:
    """conv name -> name of the BatchNorm that is its only user, from an FX trace (empty if untraceable)."""
    try:
        graph = _Tracer().trace(model)
    except Exception:  # untraceable: compare unfolded weights
        return {}
    pairs = {}
    for node in graph.nodes:
        if node.op != "call_module" or len(node.users) != 1:
            continue
        (user,) = node.users
        if user.op != "call_module":
            continue
        if isinstance(model.get_submodule(str(node.target)), nn.modules.conv._ConvNd) and isinstance(
            model.get_submodule(str(user.target)), nn.modules.batchnorm._BatchNorm
        ):
            pairs[str(node.target)] = str(user.target)
    return pairs


def fold_batchnorm(weight: torch.Tensor, bn: nn.modules.batchnorm._BatchNorm) -> torch.Tensor:
    """The conv weight with BatchNorm's per-channel scale folded in, as quantization folds it."""
    if bn.running_var is None:
        raise ValueError("cannot fold a BatchNorm without running statistics")
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    return weight * scale.reshape(-1, *([1] * (weight.ndim - 1)))


def dequantized_weight(module: nn.Module) -> torch.Tensor | None:
    """The weight a quantized (or reference, dynamic, fused, float) module computes with, as float."""
    weight = getattr(module, "weight", None)
    if callable(weight) and not isinstance(weight, torch.Tensor):  # quantized modules: weight() is packed
        value: torch.Tensor = weight()
        return value.dequantize() if value.is_quantized else value
    get_weight = getattr(module, "get_weight", None)  # reference modules: quantize-dequantize
    if callable(get_weight):
        result: torch.Tensor = get_weight()
        return result
    if isinstance(weight, torch.Tensor):
        return weight
    if isinstance(module, _FusedModule):
        return dequantized_weight(module[0])
    return None


def _per_channel(metrics: dict[str, MetricFn], ref: torch.Tensor, actual: torch.Tensor) -> tuple[ChannelMetric, ...]:
    rows_ref, rows_actual = ref.reshape(ref.shape[0], -1), actual.reshape(actual.shape[0], -1)
    return tuple(
        ChannelMetric(name=name, values=tuple(fn(r, a) for r, a in zip(rows_ref, rows_actual)))
        for name, fn in metrics.items()
    )


def compare_weights(
    float_model: nn.Module, quantized_model: nn.Module, *, metrics: Sequence[str] | None = None
) -> WeightComparison:
    """Every Linear/Conv weight of ``float_model`` against the same-named module of ``quantized_model``.

    ``metrics`` are names of built-in or plugin metrics (default: all built-ins).
    """
    chosen = load_metrics(metrics)
    folds = _batchnorm_after_conv(float_model)
    layers = []
    for fqn, (_module, kind, holder) in _candidates(float_model).items():
        try:
            quantized = quantized_model.get_submodule(fqn)
        except AttributeError:
            continue  # not in the quantized model (removed or renamed): nothing to compare
        actual = dequantized_weight(quantized)
        if actual is None:
            continue
        float_weight = holder.weight
        if not isinstance(float_weight, torch.Tensor):
            continue
        reference = float_weight.detach()
        bn_name = folds.get(fqn)
        if bn_name is not None:
            reference = fold_batchnorm(reference, float_model.get_submodule(bn_name))  # type: ignore[arg-type]
        reference, actual = reference.detach().float(), actual.detach().float()
        layers.append(
            LayerWeightComparison(
                fqn=fqn,
                kind=kind.value,
                quantized_type=f"{type(quantized).__module__}.{type(quantized).__qualname__}",
                folded_bn=bn_name,
                metrics=tuple(MetricValue(name=n, value=fn(reference, actual)) for n, fn in chosen.items()),
                per_channel=_per_channel(chosen, reference, actual),
            )
        )
    if not layers:
        raise ValueError("no Linear/Conv of the float model has a same-named module with a weight in the quantized model")
    return WeightComparison(layers=tuple(layers))


__all__ = ["compare_weights", "dequantized_weight", "fold_batchnorm"]
