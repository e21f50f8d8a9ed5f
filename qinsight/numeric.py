"""Float vs quantized, layer by layer (the Numeric Suite's job), with typed results.

Layers are matched by the float model's module names (:mod:`qinsight.quantized_layers`
reads them from ``convert_fx`` modules or ``convert_pt2e`` graph nodes). A
BatchNorm that directly follows a conv in the float model is folded into the
float weight first, because the quantized conv absorbed it: comparing the
unfolded weight would measure the fold, not quantization.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

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


def _batchnorm_after_conv(model: nn.Module) -> dict[str, str]:
    """conv name -> name of the BatchNorm that is its only user (the start of its tail chain)."""
    return {
        fqn: chain[0][0]
        for fqn, chain in _tail_chains(model).items()
        if isinstance(model.get_submodule(fqn), nn.modules.conv._ConvNd)
        and isinstance(chain[0][1], nn.modules.batchnorm._BatchNorm)
    }


def _compared_at(layer: QuantizedLayer, chain: list[tuple[str, nn.Module]]) -> str:
    """Where the float output matches the quantized layer's: after the float modules it absorbed."""
    point = layer.fqn
    for name, module in chain:
        if not layer.absorbs(module):
            break
        point = name
    return point


class _Raw(NamedTuple):
    """A layer output as its integers and per-tensor qparams, or (``scale`` None) as the output itself."""

    values: torch.Tensor
    scale: float | None = None
    zero_point: int = 0

    def tensor(self) -> torch.Tensor:
        """The output as float; for integers bit-identical to ``Tensor.dequantize()``, which
        computes (q - zero_point) * scale in float32 too."""
        if self.scale is None:
            return dequantize(self.values).detach().float()
        return (self.values.float() - self.zero_point) * self.scale


_INTEGERS = {torch.quint8: torch.uint8, torch.qint8: torch.int8, torch.qint32: torch.int32}


def _raw(output: object) -> _Raw:
    """Splits a dense per-tensor quantized tensor into integers and qparams; keeps anything else whole.

    The integers are a view of the tensor's own storage: ``int_repr()`` copies, and
    measured 7 ms on a 10M-value activation, more than the comparison's arithmetic on it.
    """
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"expected a tensor output, got {type(output).__name__}")
    if not output.is_quantized or not _dense(output):
        return _Raw(output)
    integer = _INTEGERS.get(output.dtype)
    if integer is None or output.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return _Raw(output)
    values = torch.empty(0, dtype=integer).set_(output.untyped_storage(), output.storage_offset(), output.shape, output.stride())
    return _Raw(values, output.q_scale(), output.q_zero_point())


class _KeptOutputs:
    """Layer outputs of the current batch, waiting for the float forward to reach their layer.

    With ``copied``, outputs are copied into one block of buffers that is reused
    batch after batch, planned from what the previous batch kept (an output with
    no room yet is kept as it is). The quantized models' outputs wait through
    the whole float forward; keeping the models' own tensors alive that long, or
    lasting buffers scattered through the heap, made the allocator hand out
    fresh pages on every batch (page faults cost the comparison more than its
    arithmetic: measured 0.41 against 0.43-0.45 s per MobileNetV2 batch).
    """

    def __init__(self, *, copied: bool) -> None:
        self._copied = copied
        self._kept: dict[tuple[str, str], list[_Raw | None]] = {}
        self._buffers: dict[tuple[str, str, int], torch.Tensor] = {}
        self._wanted: dict[tuple[str, str, int], tuple[int, torch.dtype]] = {}
        self._short = False

    def new_batch(self) -> None:
        self._kept.clear()
        if self._short:
            self._plan()

    def keep(self, key: str, fqn: str, output: object) -> None:
        calls = self._kept.setdefault((key, fqn), [])
        raw = _raw(output)
        calls.append(self._copy((key, fqn, len(calls)), raw) if self._copied else raw)

    def take(self, key: str, fqn: str, call: int) -> _Raw | None:
        """Call ``call``'s output, valid until the next batch; None if the layer was not called that often."""
        calls = self._kept.get((key, fqn))
        if calls is None or call >= len(calls):
            return None
        kept, calls[call] = calls[call], None
        return kept

    def _copy(self, slot: tuple[str, str, int], raw: _Raw) -> _Raw:
        values = raw.values
        if values.is_quantized or not _dense(values):  # per-channel and strided outputs: kept as they are
            return raw
        numel, dtype = values.numel(), values.dtype
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype:
            self._wanted[slot] = (numel, dtype)  # room for it from the next batch on
            self._short = True
            return raw
        return raw._replace(values=buffer[:numel].as_strided(values.shape, values.stride()).copy_(values.detach()))

    def _plan(self) -> None:
        """One block holding a buffer for every slot kept so far."""
        wanted = {slot: (buffer.numel(), buffer.dtype) for slot, buffer in self._buffers.items()} | self._wanted
        nbytes = {slot: numel * dtype.itemsize for slot, (numel, dtype) in wanted.items()}
        aligned = {slot: -(-n // 64) * 64 for slot, n in nbytes.items()}
        self._buffers.clear()  # before the new block is allocated, so the old one can be reused
        block, offset = torch.empty(sum(aligned.values()), dtype=torch.uint8), 0
        for slot, (_numel, dtype) in wanted.items():
            self._buffers[slot] = block[offset : offset + nbytes[slot]].view(dtype)
            offset += aligned[slot]
        self._wanted.clear()
        self._short = False


class _Scratch:
    """Reusable buffers: one for a float reference laid out anew, two of one chunk each.

    A fresh 40 MB tensor per layer and batch cost more in page faults than the
    arithmetic on it (15 ms of 37 on a MobileNetV2 activation).
    """

    def __init__(self) -> None:
        self._reference = torch.empty(0)
        self.values = torch.empty(_CHUNK)
        self.error = torch.empty(_CHUNK)

    def laid_out_as(self, tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``tensor`` in ``like``'s memory layout: itself if it already is, else a copy in a reused buffer.

        Quantized convs give channels-last outputs and float ones NCHW. Laying the
        float reference out once costs less than two subtractions across layouts
        (2.5x slower than within one), one for the propagated and one for the local error.
        """
        if tensor.stride() == like.stride() or not _dense(like) or tensor.shape != like.shape:
            return tensor
        if self._reference.numel() < like.numel():
            self._reference = torch.empty(like.numel())
        return self._reference.as_strided(like.shape, like.stride()).copy_(tensor)


# Values per chunk: about 4 MB of float32 each for the values and the error, so the
# passes over a chunk run from cache. Measured on a 10M-value activation: 9.9 ms for
# all passes of both comparisons chunk by chunk, 22.9 ms tensor by tensor.
_CHUNK = 2**20


def _dense(tensor: torch.Tensor) -> bool:
    return tensor.is_contiguous() or tensor.is_contiguous(memory_format=torch.channels_last)


class _Reference:
    """A layer's float output for one batch, laid out as the quantized output is, and its energy."""

    def __init__(self, output: torch.Tensor, like: torch.Tensor, scratch: _Scratch) -> None:
        self.tensor = scratch.laid_out_as(output.detach().float(), like)
        self.sq: float | None = None  # summed by the first comparison, chunk by chunk


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as 1-D in memory order: a view for contiguous and channels-last tensors."""
    if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last):
        return tensor.permute(0, 2, 3, 1).reshape(-1)
    return tensor.reshape(-1)


class _Sums(NamedTuple):
    ref_sq: float
    act_sq: float
    err_sq: float
    max_abs: float


def _chunk_sums(reference: _Reference, actual: _Raw, scratch: _Scratch) -> _Sums:
    """|x|², |y|², |x - y|² and max |x - y| for the reference x and the output y, one chunk at a time.

    ``y = (values - zero_point) * scale`` is never written out: the scale is
    applied inside the subtraction (``alpha``). |x|² is summed once per
    reference and kept on it. Both run flat in memory order when their layouts agree
    (reductions over a flat tensor are fast whatever the layout; aminmax over a
    channels-last 4-D tensor measured 30x slower).
    """
    x, y = reference.tensor, actual.values
    x, y = (_flat(x), _flat(y)) if x.stride() == y.stride() and _dense(y) else (x.reshape(-1), y.reshape(-1))
    integers = actual.scale is not None
    scale = actual.scale if actual.scale is not None else 1.0
    act_sq = err_sq = max_abs = ref_sq = 0.0
    for start in range(0, y.numel(), _CHUNK):
        x_part, y_part = x[start : start + _CHUNK], y[start : start + _CHUNK]
        if integers:  # q - zero_point in float32, exact below 2^24
            y_part = scratch.values[: y_part.numel()].copy_(y_part).sub_(actual.zero_point)
        error = torch.sub(x_part, y_part, alpha=scale, out=scratch.error[: y_part.numel()])
        # float32 BLAS dots: 2.3x faster than vector_norm, within 0.01 dB of float64 sums
        act_sq += float(torch.dot(y_part, y_part))
        err_sq += float(torch.dot(error, error))
        low, high = torch.aminmax(error)
        max_abs = max(max_abs, -float(low), float(high))
        if reference.sq is None:
            ref_sq += float(torch.dot(x_part, x_part))
    if reference.sq is None:
        reference.sq = ref_sq
    return _Sums(ref_sq=reference.sq, act_sq=scale**2 * act_sq, err_sq=err_sq, max_abs=max_abs)


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

    def add(self, reference: _Reference, actual: _Raw, scratch: _Scratch) -> None:
        """Adds one batch's output, compared with the float reference."""
        values = actual.values if actual.scale is not None else actual.tensor()
        if values.shape != reference.tensor.shape:
            raise ValueError(f"cannot compare outputs of shapes {tuple(reference.tensor.shape)} and {tuple(values.shape)}")
        sums = _chunk_sums(reference, actual._replace(values=values), scratch)
        self.ref_sq += sums.ref_sq
        self.act_sq += sums.act_sq
        self.err_sq += sums.err_sq
        self.max_abs = max(self.max_abs, sums.max_abs)
        self.count += values.numel()
        self.batches += 1
        if self.plugins:  # third-party metrics: the mean over batches
            output = actual.tensor()
            for name, fn in self.plugins.items():
                self.plugin_sums[name] += fn(reference.tensor, output)

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


class _Streamer:
    """Compares each layer the moment the float forward reaches its comparison point.

    The quantized models run first and keep their layers' outputs. The float
    model runs last. When it enters a layer, each quantized version of the layer
    runs on the float input (the local error) and that output is kept too, so
    the float input is let go as in a plain forward. At the layer's comparison
    point both kept outputs are compared with the float output. Kept outputs are
    quantized (1 byte per value) where the layer's are. A layer called several
    times is compared call by call.
    """

    def __init__(
        self,
        float_model: nn.Module,
        layers: dict[str, dict[str, QuantizedLayer]],
        points: dict[str, dict[str, str]],
        sums: dict[str, dict[str, tuple[_ErrorSums, _ErrorSums]]],
    ) -> None:
        self.layers, self.sums, self.scratch = layers, sums, _Scratch()
        # local outputs wait only from the layer's call to its comparison point
        self.outputs, self.local_outputs = _KeptOutputs(copied=True), _KeptOutputs(copied=False)
        self._compared: Counter[tuple[str, str]] = Counter()
        self._at: dict[str, list[tuple[str, str]]] = {}
        self._versions: dict[str, list[str]] = {}
        for key, at in points.items():
            for fqn, point in at.items():
                self._at.setdefault(point, []).append((key, fqn))
                self._versions.setdefault(fqn, []).append(key)
        self.removers: list[Callable[[], None]] = []
        try:  # all attached, or none left behind
            for fqn in self._versions:
                self.removers.append(float_model.get_submodule(fqn).register_forward_pre_hook(self._run_local(fqn)).remove)
            for point in self._at:
                self.removers.append(float_model.get_submodule(point).register_forward_hook(self._compare_at(point)).remove)
            for key, found in layers.items():
                for fqn, layer in found.items():
                    self.removers.append(layer.attach(self._keep_output(key, fqn)))
        except BaseException:
            self.remove()
            raise

    def new_batch(self) -> None:
        self.outputs.new_batch()
        self.local_outputs.new_batch()
        self._compared.clear()

    def remove(self) -> None:
        for remove in self.removers:
            remove()

    def _keep_output(self, key: str, fqn: str) -> Callable[[torch.Tensor], None]:
        def keep(output: torch.Tensor) -> None:
            self.outputs.keep(key, fqn, output)

        return keep

    def _run_local(self, fqn: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def run(_module: nn.Module, args: tuple[Any, ...]) -> None:
            for key in self._versions[fqn]:
                self.local_outputs.keep(key, fqn, self.layers[key][fqn].local(args[0]))

        return run

    def _compare_at(self, point: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def compare(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
            reference = None
            for key, fqn in self._at[point]:
                call = self._compared[key, fqn]
                self._compared[key, fqn] += 1
                kept, local_kept = self.outputs.take(key, fqn, call), self.local_outputs.take(key, fqn, call)
                if kept is None or local_kept is None:
                    continue  # the quantized model did not reach this layer (so often)
                reference = reference or _Reference(dequantize(output), like=kept.values, scratch=self.scratch)
                propagated, local = self.sums[key][fqn]
                propagated.add(reference, kept, self.scratch)
                local.add(reference, local_kept, self.scratch)

        return compare


def measure_activations(
    float_model: nn.Module,
    quantized_models: Mapping[str, nn.Module],
    data: Iterable[object],
    *,
    metrics: Sequence[str] | None = None,
) -> dict[str, ActivationComparison]:
    """:func:`compare_activations` for several quantized versions of ``float_model`` in one pass over ``data``.

    Per batch each quantized model runs once, then the float model, and, for the
    local error, each quantized layer on the float model's input.
    """
    names = tuple(DEFAULT if metrics is None else metrics)
    plugins = {n: fn for n, fn in load_metrics(names).items() if n not in DEFAULT}
    layers = {key: quantized_layers(float_model, model) for key, model in quantized_models.items()}
    for key, found in layers.items():
        if not found:
            raise ValueError(f"no Linear/Conv of the float model has a counterpart in the quantized model {key!r}")
    chains = _tail_chains(float_model)
    points = {key: {fqn: _compared_at(layer, chains.get(fqn, [])) for fqn, layer in found.items()} for key, found in layers.items()}
    sums = {key: {fqn: (_ErrorSums(plugins), _ErrorSums(plugins)) for fqn in found} for key, found in layers.items()}
    streamer = _Streamer(float_model, layers, points, sums)
    try:
        with contextlib.ExitStack() as stack:
            for model in (float_model, *quantized_models.values()):
                stack.enter_context(eval_mode(model))
            stack.enter_context(torch.no_grad())
            for batch in data:
                streamer.new_batch()
                for model in quantized_models.values():
                    run_batch(model, batch)
                run_batch(float_model, batch)
    finally:
        streamer.remove()
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


__all__ = ["compare_activations", "compare_weights", "fold_batchnorm", "measure_activations"]
