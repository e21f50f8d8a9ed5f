"""Float vs quantized weights, per layer and per output channel.

A BatchNorm that directly follows a conv in the float model is folded into the
float weight first, because the quantized conv absorbed it: comparing the
unfolded weight would measure the fold, not quantization.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from qinsight.compare.layers import QuantizedLayer, quantized_layers
from qinsight.compare.metric_functions import load_metrics
from qinsight.core.comparison import (
    ChannelMetric,
    LayerWeightComparison,
    MetricValue,
    WeightComparison,
)
from qinsight.core.errors import InvalidParameterError
from qinsight.frontends import ModelStructure, model_structure
from qinsight.plugin.metric import Metric


def fold_batchnorm(weight: torch.Tensor, bn: nn.modules.batchnorm._BatchNorm) -> torch.Tensor:
    """The conv weight with BatchNorm's per-channel scale folded in, as quantization folds it."""
    if bn.running_var is None:
        raise InvalidParameterError(
            "compare_weights",
            "float_model",
            "a BatchNorm without running statistics",
            "BatchNorms with running statistics to fold",
        )
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    return weight * scale.reshape(-1, *([1] * (weight.ndim - 1)))


def reference_weight(
    float_model: nn.Module, structure: ModelStructure, folds: dict[str, str], layer: QuantizedLayer
) -> tuple[torch.Tensor, str | None] | None:
    """The float weight ``layer`` quantized, as float32: its float layer's, with the BatchNorm after it
    folded in where ``layer`` absorbed it (``folds``: :meth:`ModelStructure.batchnorm_after_conv`), and
    that BatchNorm's name; ``None`` where the float layer holds no weight tensor."""
    float_weight = structure.modules[layer.fqn].holder.weight
    if not isinstance(float_weight, torch.Tensor):
        return None
    reference = float_weight.detach()
    bn_name = folds.get(layer.fqn)
    if bn_name is not None and not layer.absorbs(float_model.get_submodule(bn_name)):
        bn_name = None  # kept apart (FX after a functional conv): the weight is the conv's own
    if bn_name is not None:
        reference = fold_batchnorm(reference, float_model.get_submodule(bn_name))  # type: ignore[arg-type]
    return reference.float(), bn_name


def _per_channel(metrics: dict[str, Metric], ref: torch.Tensor, actual: torch.Tensor) -> tuple[ChannelMetric, ...]:
    rows_ref, rows_actual = ref.reshape(ref.shape[0], -1), actual.reshape(actual.shape[0], -1)
    return tuple(
        ChannelMetric(name=name, values=tuple(metric.on_tensors(r, a) for r, a in zip(rows_ref, rows_actual)))
        for name, metric in metrics.items()
    )


def compare_weights(
    float_model: nn.Module,
    quantized_model: nn.Module,
    *,
    metrics: Sequence[str] | None = None,
    structure: ModelStructure | None = None,
) -> WeightComparison:
    """Every Linear/Conv weight of ``float_model`` against its quantized version in ``quantized_model``.

    Args:
        float_model: the model as it was before quantization.
        quantized_model: from ``convert_fx`` (or eager conversion), or a ``convert_pt2e`` graph.
        metrics: names of built-in or plugin metrics (default: all built-ins).
        structure: :func:`qinsight.frontends.model_structure` of ``float_model``, where the caller has it
            already (it traces the model).

    Returns:
        The :class:`WeightComparison`: a row per layer with a quantized weight.

    Raises:
        InvalidParameterError: ``quantized_model`` is no quantized version of ``float_model``.
    """
    chosen = load_metrics(metrics)
    structure = structure if structure is not None else model_structure(float_model)
    folds = structure.batchnorm_after_conv()
    layers = []
    for fqn, layer in quantized_layers(float_model, quantized_model, structure).items():
        found = reference_weight(float_model, structure, folds, layer)
        if found is None:
            continue
        reference, bn_name = found
        actual = layer.weight().detach().float()
        layers.append(
            LayerWeightComparison(
                fqn=fqn,
                kind=layer.kind.value,
                quantized_type=layer.quantized_type,
                quantized=layer.quantized,
                folded_bn=bn_name,
                metrics=tuple(
                    MetricValue(name=n, value=m.on_tensors(reference, actual), higher_is_better=m.higher_is_better)
                    for n, m in chosen.items()
                ),
                per_channel=_per_channel(chosen, reference, actual),
            )
        )
    if not layers:
        raise InvalidParameterError(
            "compare_weights",
            "quantized",
            type(quantized_model).__name__,
            "a quantized version of the float model: no Linear/Conv of the float model has a quantized counterpart "
            "with a weight in it",
        )
    return WeightComparison(layers=tuple(layers))


__all__ = ["compare_weights", "fold_batchnorm", "reference_weight"]
