"""Float vs quantized, layer by layer (the Numeric Suite's job), with typed results.

Layers are matched by the float model's module names, which ``convert_fx``
keeps. A BatchNorm that directly follows a conv in the float model is folded
into the float weight first, because the quantized conv absorbed it:
comparing the unfolded weight would measure the fold, not quantization.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from qinsight.comparison import (
    ActivationComparison,
    ChannelMetric,
    LayerActivationComparison,
    LayerWeightComparison,
    MetricValue,
    WeightComparison,
)
from qinsight.frontends.base import eval_mode, run_batch
from qinsight.frontends.eager import _candidates
from qinsight.frontends.fx import _Tracer
from qinsight.metrics import DEFAULT, MetricFn, load_metrics
from qinsight.quantized_layers import QuantizedLayer, dequantize, quantized_layers


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


_TAIL_TYPES = (nn.modules.batchnorm._BatchNorm, nn.ReLU, nn.ReLU6, nn.Hardtanh)


def _tail_chains(model: nn.Module) -> dict[str, list[tuple[str, nn.Module]]]:
    """Linear/Conv name -> the BatchNorm/ReLU modules that follow it, each the only user of the last.

    Quantization may fuse these into the layer. Which of them it did depends on
    the flow (FX fuses ReLU but not ReLU6; PT2E quantizes after either), so the
    quantized layer decides (:meth:`QuantizedLayer.absorbs`).
    """
    try:
        graph = _Tracer().trace(model)
    except Exception:  # untraceable: compare at the layer itself
        return {}
    chains: dict[str, list[tuple[str, nn.Module]]] = {}
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        chain: list[tuple[str, nn.Module]] = []
        tail = node
        while len(tail.users) == 1:
            (user,) = tail.users
            if user.op != "call_module" or not isinstance(module := model.get_submodule(str(user.target)), _TAIL_TYPES):
                break
            chain.append((str(user.target), module))
            tail = user
        if chain:
            chains[str(node.target)] = chain
    return chains


def _compared_at(layer: QuantizedLayer, chain: list[tuple[str, nn.Module]]) -> str:
    """Where the float output matches the quantized layer's: after the float modules it absorbed."""
    point = layer.fqn
    for name, module in chain:
        if not layer.absorbs(module):
            break
        point = name
    return point


def _channels_last(tensor: torch.Tensor) -> bool:
    return tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last)


def _flat(tensor: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``tensor`` as 1-D in NCHW or NHWC element order; a view when it is already laid out that way.

    Quantized convs give channels-last outputs: flattening them NHWC needs no copy.
    """
    tensor = tensor.detach().float()
    if channels_last:
        return tensor.permute(0, 2, 3, 1).reshape(-1)
    return tensor.reshape(-1)


class _Reference:
    """A layer's float output for one batch, flattened once in the quantized side's element order."""

    def __init__(self, output: torch.Tensor, like: torch.Tensor) -> None:
        self.tensor = output
        self.channels_last = _channels_last(like)
        self.flat = _flat(output, self.channels_last)
        self.sq = float(torch.dot(self.flat, self.flat))


class _ErrorSums:
    """Sums over batches from which every built-in metric follows: O(1) memory per layer.

    Cosine needs no sum of its own: x·y = (|x|² + |y|² - |x - y|²) / 2.
    """

    def __init__(self, plugins: dict[str, MetricFn]) -> None:
        self.ref_sq = self.err_sq = self.act_sq = 0.0
        self.max_abs = 0.0
        self.count = 0
        self.plugins = plugins
        self.plugin_sums = dict.fromkeys(plugins, 0.0)
        self.batches = 0

    def add(self, reference: _Reference, actual: torch.Tensor) -> None:
        # float32 dot products (BLAS, blocked accumulation): no float64 copy of activations
        # that reach 10M elements; each sum is added into a Python float (float64).
        if reference.channels_last and not _channels_last(actual):  # same element order as the reference
            actual = actual.contiguous(memory_format=torch.channels_last)
        y = _flat(actual, reference.channels_last)
        error = reference.flat - y
        self.ref_sq += reference.sq
        self.err_sq += float(torch.dot(error, error))
        self.act_sq += float(torch.dot(y, y))
        if error.numel():
            low, high = torch.aminmax(error)
            self.max_abs = max(self.max_abs, -float(low), float(high))
        self.count += y.numel()
        self.batches += 1
        for name, fn in self.plugins.items():  # third-party metrics: the mean over batches
            self.plugin_sums[name] += fn(reference.tensor, actual)

    def values(self, names: Sequence[str]) -> tuple[MetricValue, ...]:
        exact = self.err_sq == 0.0
        derived = {
            "sqnr": math.inf if exact else (-math.inf if self.ref_sq == 0.0 else 10 * math.log10(self.ref_sq / self.err_sq)),
            "relative_l2": 0.0 if exact else (math.inf if self.ref_sq == 0.0 else math.sqrt(self.err_sq / self.ref_sq)),
            "cosine": (1.0 if self.ref_sq == self.act_sq else 0.0)
            if self.ref_sq == 0.0 or self.act_sq == 0.0
            else (self.ref_sq + self.act_sq - self.err_sq) / (2 * math.sqrt(self.ref_sq * self.act_sq)),
            "max_abs_error": self.max_abs,
            "mse": self.err_sq / self.count if self.count else 0.0,
        }
        return tuple(
            MetricValue(name=n, value=derived[n] if n in derived else self.plugin_sums[n] / max(self.batches, 1))
            for n in names
        )


def fold_batchnorm(weight: torch.Tensor, bn: nn.modules.batchnorm._BatchNorm) -> torch.Tensor:
    """The conv weight with BatchNorm's per-channel scale folded in, as quantization folds it."""
    if bn.running_var is None:
        raise ValueError("cannot fold a BatchNorm without running statistics")
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    return weight * scale.reshape(-1, *([1] * (weight.ndim - 1)))


def _per_channel(metrics: dict[str, MetricFn], ref: torch.Tensor, actual: torch.Tensor) -> tuple[ChannelMetric, ...]:
    rows_ref, rows_actual = ref.reshape(ref.shape[0], -1), actual.reshape(actual.shape[0], -1)
    return tuple(
        ChannelMetric(name=name, values=tuple(fn(r, a) for r, a in zip(rows_ref, rows_actual)))
        for name, fn in metrics.items()
    )


def compare_weights(
    float_model: nn.Module, quantized_model: nn.Module, *, metrics: Sequence[str] | None = None
) -> WeightComparison:
    """Every Linear/Conv weight of ``float_model`` against its quantized version in ``quantized_model``.

    ``quantized_model`` comes from ``convert_fx`` (or eager conversion), or is a
    ``convert_pt2e`` graph. ``metrics`` are names of built-in or plugin metrics
    (default: all built-ins).
    """
    chosen = load_metrics(metrics)
    folds = _batchnorm_after_conv(float_model)
    holders = {fqn: holder for fqn, (_module, _kind, holder) in _candidates(float_model).items()}
    layers = []
    for fqn, layer in quantized_layers(float_model, quantized_model).items():
        float_weight = holders[fqn].weight
        if not isinstance(float_weight, torch.Tensor):
            continue
        reference = float_weight.detach()
        bn_name = folds.get(fqn)
        if bn_name is not None:
            reference = fold_batchnorm(reference, float_model.get_submodule(bn_name))  # type: ignore[arg-type]
        reference, actual = reference.detach().float(), layer.weight().detach().float()
        layers.append(
            LayerWeightComparison(
                fqn=fqn,
                kind=layer.kind.value,
                quantized_type=layer.quantized_type,
                quantized=layer.quantized,
                folded_bn=bn_name,
                metrics=tuple(MetricValue(name=n, value=fn(reference, actual)) for n, fn in chosen.items()),
                per_channel=_per_channel(chosen, reference, actual),
            )
        )
    if not layers:
        raise ValueError("no Linear/Conv of the float model has a quantized counterpart with a weight in the quantized model")
    return WeightComparison(layers=tuple(layers))


def compare_activations(
    float_model: nn.Module,
    quantized_model: nn.Module,
    data: Iterable[object],
    *,
    metrics: Sequence[str] | None = None,
) -> ActivationComparison:
    """Per Linear/Conv: the propagated and the local error of ``quantized_model`` against ``float_model``.

    ``quantized_model`` comes from ``convert_fx`` (or eager conversion), or is a
    ``convert_pt2e`` graph of ``float_model``. Both models run on every batch of
    ``data`` (eval mode, no gradients, hooks and taps removed afterwards).
    Memory is O(layers) whatever the number of batches.
    """
    return measure_activations(float_model, {"": quantized_model}, data, metrics=metrics)[""]


class _FloatTaps:
    """Per batch: the float model's input to each compared layer, and its output at each comparison point."""

    def __init__(self, float_model: nn.Module, fqns: Iterable[str], points: Iterable[str]) -> None:
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.removers = [
            float_model.get_submodule(fqn).register_forward_pre_hook(lambda _m, a, f=fqn: self.inputs.__setitem__(f, a[0])).remove
            for fqn in fqns
        ]
        self.removers += [
            float_model.get_submodule(point).register_forward_hook(
                lambda _m, _a, out, p=point: self.outputs.__setitem__(p, out)
            ).remove
            for point in points
        ]

    def remove(self) -> None:
        for remove in self.removers:
            remove()


def measure_activations(
    float_model: nn.Module,
    quantized_models: Mapping[str, nn.Module],
    data: Iterable[object],
    *,
    metrics: Sequence[str] | None = None,
) -> dict[str, ActivationComparison]:
    """:func:`compare_activations` for several quantized versions of ``float_model`` in one pass over ``data``.

    Per batch the float model runs once, then each quantized model and, for the
    local error, each of its layers on the float model's input.
    """
    names = tuple(DEFAULT if metrics is None else metrics)
    plugins = {n: fn for n, fn in load_metrics(names).items() if n not in DEFAULT}
    layers = {key: quantized_layers(float_model, model) for key, model in quantized_models.items()}
    for key, found in layers.items():
        if not found:
            raise ValueError(f"no Linear/Conv of the float model has a counterpart in the quantized model {key!r}")
    chains = _tail_chains(float_model)
    points = {key: {fqn: _compared_at(layer, chains.get(fqn, [])) for fqn, layer in found.items()} for key, found in layers.items()}
    floats = _FloatTaps(
        float_model, {fqn for found in layers.values() for fqn in found}, {p for at in points.values() for p in at.values()}
    )
    outputs: dict[str, dict[str, torch.Tensor]] = {key: {} for key in layers}
    detachers = [
        layer.attach(_store(outputs[key], fqn)) for key, found in layers.items() for fqn, layer in found.items()
    ]
    sums = {key: {fqn: (_ErrorSums(plugins), _ErrorSums(plugins)) for fqn in found} for key, found in layers.items()}
    try:
        with contextlib.ExitStack() as stack:
            for model in (float_model, *quantized_models.values()):
                stack.enter_context(eval_mode(model))
            stack.enter_context(torch.no_grad())
            for batch in data:
                floats.outputs.clear()
                run_batch(float_model, batch)
                for key, model in quantized_models.items():
                    outputs[key].clear()
                    run_batch(model, batch)
                    _add_batch(layers[key], points[key], floats, outputs[key], sums[key])
    finally:
        floats.remove()
        for detach in detachers:
            detach()
    return {
        key: ActivationComparison(
            layers=tuple(
                LayerActivationComparison(
                    fqn=fqn,
                    kind=layer.kind.value,
                    quantized_type=layer.quantized_type,
                    quantized=layer.quantized,
                    compared_at=points[key][fqn],
                    batches=sums[key][fqn][0].batches,
                    propagated=sums[key][fqn][0].values(names),
                    local=sums[key][fqn][1].values(names),
                )
                for fqn, layer in found.items()
            )
        )
        for key, found in layers.items()
    }


def _store(into: dict[str, torch.Tensor], fqn: str) -> Callable[[torch.Tensor], None]:
    def store(output: torch.Tensor) -> None:
        into[fqn] = output

    return store


def _add_batch(
    layers: dict[str, QuantizedLayer],
    points: dict[str, str],
    floats: _FloatTaps,
    outputs: dict[str, torch.Tensor],
    sums: dict[str, tuple[_ErrorSums, _ErrorSums]],
) -> None:
    for fqn, layer in layers.items():
        if points[fqn] not in floats.outputs or fqn not in outputs:
            continue  # not reached by this batch
        actual = outputs[fqn]
        reference = _Reference(dequantize(floats.outputs[points[fqn]]), like=actual)
        propagated, local = sums[fqn]
        propagated.add(reference, actual)
        local.add(reference, layer.local(floats.inputs[fqn]))


__all__ = ["compare_activations", "compare_weights", "fold_batchnorm", "measure_activations"]
