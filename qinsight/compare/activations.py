"""Float vs quantized activations, layer by layer (the Numeric Suite's job): propagated and local error.

Layers are matched by the float model's module names (:mod:`qinsight.compare.layers`
reads them from ``convert_fx`` modules or ``convert_pt2e`` graph nodes). The
error sums live in :mod:`qinsight.compare.accumulate`; this module decides what
runs when.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch import nn

from qinsight.compare.accumulate import ErrorSums, KeptOutputs, Reference, Scratch, split_output
from qinsight.compare.layers import QuantizedLayer, dequantize, quantized_layers
from qinsight.compare.layout import FloatLayout
from qinsight.compare.metrics import DEFAULT, load_metrics
from qinsight.compare.ops import FloatOps, GraphOp, quantized_ops
from qinsight.core.comparison import ActivationComparison, LayerActivationComparison
from qinsight.core.errors import InvalidParameterError
from qinsight.core.sites import call_site_name
from qinsight.distributed import Exchange, sharing_failures
from qinsight.frontends import (
    ModelStructure,
    TailChain,
    eval_mode,
    hidden_calls,
    model_structure,
    run_batch,
    tap_each,
)


@attrs.frozen
class ComparisonPoint:
    """Where the float output matches a quantized layer's: the output of float module ``module``,
    then the functional activations the layer absorbed (``F.relu``: no module to hook) applied to it."""

    module: str
    then: tuple[nn.Module, ...] = ()

    @property
    def label(self) -> str:
        """``fc1``, or ``fc1+relu`` where a functional ReLU follows fc1 in the float model."""
        return "".join([self.module, *(f"+{type(step).__name__.lower()}" for step in self.then)])

    def reference(self, output: torch.Tensor) -> torch.Tensor:
        for step in self.then:
            output = step(output)
        return output


def _compared_at(layer: QuantizedLayer, chain: TailChain) -> ComparisonPoint:
    """After the float steps the quantized layer absorbed (BatchNorm, ReLU, also functional ones)."""
    point, then = layer.fqn, []
    for name, module in chain:
        if not layer.absorbs(module):
            break
        if name is None:
            then.append(module)
        else:
            point, then = name, []
    return ComparisonPoint(point, tuple(then))


def compare_activations(
    float_model: nn.Module,
    quantized_model: nn.Module,
    data: Iterable[object],
    *,
    metrics: Sequence[str] | None = None,
    structure: ModelStructure | None = None,
    distributed: bool = False,
) -> ActivationComparison:
    """Per Linear/Conv, and per op around them: the propagated and the local error of ``quantized_model``
    against ``float_model``.

    The ops (adds, matmuls, softmax, norms...: :mod:`qinsight.compare.ops`) are compared in both graphs,
    named as the report names their sites; an eagerly converted model has layer rows only. Both models
    run on every batch of ``data`` (eval mode, no gradients, hooks and taps removed afterwards); memory
    is O(layers) whatever the number of batches.

    Args:
        float_model: the model as it was before quantization.
        quantized_model: from ``convert_fx`` (or eager conversion), or a ``convert_pt2e`` graph of
            ``float_model``.
        data: the batches both run on.
        metrics: names of built-in or plugin metrics (default: all built-ins).
        structure: :func:`qinsight.frontends.model_structure` of ``float_model``, where the caller has it.
        distributed: every rank of the process group passes its own batches and gets the comparison of
            all of them (docs/scale.md).

    Returns:
        The :class:`ActivationComparison`: a row per layer and op, worst first on request.
    """
    return measure_activations(
        float_model, {"": quantized_model}, data, metrics=metrics, structure=structure, distributed=distributed
    )[""]


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
        points: dict[str, dict[str, ComparisonPoint]],
        sums: dict[str, dict[str, tuple[ErrorSums, ErrorSums]]],
    ) -> None:
        self.layers, self.sums, self.scratch = layers, sums, Scratch()
        # local outputs wait only from the layer's call to its comparison point
        self.outputs, self.local_outputs = KeptOutputs(copied=True), KeptOutputs(copied=False)
        self._compared: Counter[tuple[str, str]] = Counter()
        # float module -> where its output is a reference -> the layers compared with that reference
        self._at: dict[str, dict[ComparisonPoint, list[tuple[str, str]]]] = {}
        self._versions: dict[str, list[str]] = {}
        for key, at in points.items():
            for fqn, point in at.items():
                self._at.setdefault(point.module, {}).setdefault(point, []).append((key, fqn))
                self._versions.setdefault(fqn, []).append(key)
        self.removers: list[Callable[[], None]] = []
        try:  # all attached, or none left behind
            for fqn in self._versions:
                self.removers.append(
                    float_model.get_submodule(fqn).register_forward_pre_hook(self._run_local(fqn)).remove
                )
            for module in self._at:
                self.removers.append(
                    float_model.get_submodule(module).register_forward_hook(self._compare_at(module)).remove
                )
            for key, found in layers.items():
                for fqn, layer in found.items():
                    self.removers.append(layer.attach(self.keeper(key, fqn)))
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

    def keeper(self, key: str, fqn: str) -> Callable[[torch.Tensor], None]:
        """What keeps quantized model ``key``'s output of ``fqn`` (a layer or an op) for this batch."""

        def keep(output: torch.Tensor) -> None:
            self.outputs.keep(key, fqn, output)

        return keep

    def _run_local(self, fqn: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def run(_module: nn.Module, args: tuple[Any, ...]) -> None:
            with hidden_calls():  # while op rows are compared, a tap counts the float model's calls
                for key in self._versions[fqn]:
                    self.local_outputs.keep(key, fqn, self.layers[key][fqn].local(args[0]))

        return run

    def _compare_at(self, module: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def compare(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
            with hidden_calls():  # a plugin metric's torch calls are not the float model's
                self._compare_members(module, output)

        return compare

    def _compare_members(self, module: str, output: Any) -> None:
        # one reference at a time: it may live in the scratch buffer, reused by the next
        for at, members in self._at[module].items():
            reference = None
            for key, fqn in members:
                call = self._compared[key, fqn]
                self._compared[key, fqn] += 1
                kept, local_kept = self.outputs.take(key, fqn, call), self.local_outputs.take(key, fqn, call)
                if kept is None or local_kept is None:
                    continue  # the quantized model did not reach this layer (so often)
                if reference is None:
                    reference = Reference(at.reference(dequantize(output)), like=kept.values, scratch=self.scratch)
                propagated, local = self._sums(key, call_site_name(fqn, call), fqn)
                propagated.add(reference, kept, self.scratch)
                local.add(reference, local_kept, self.scratch)

    def _sums(self, key: str, name: str, fqn: str) -> tuple[ErrorSums, ErrorSums]:
        """The error sums of one call of a layer (a row per call: ``fc``, ``fc#1``), made at its first call."""
        found = self.sums[key]
        if name not in found:
            first = found[fqn][0]
            found[name] = (ErrorSums(first.metrics), ErrorSums(first.metrics))
        return found[name]


class _OpStreamer:
    """Compares each op (add, matmul, softmax...) of the quantized graphs as the float forward makes its call.

    The quantized graphs' op outputs are kept as the layers' are. At the float
    call the operands and the output are at hand at once: the local run (the
    quantized op's stretch of graph on the float operands) and both comparisons
    happen there.
    """

    def __init__(
        self,
        float_model: nn.Module,
        float_ops: FloatOps,
        ops: dict[str, dict[str, list[GraphOp]]],
        sums: dict[str, dict[str, tuple[ErrorSums, ErrorSums]]],
        layers: _Streamer,
    ) -> None:
        self.ops, self.sums, self.outputs, self.scratch = ops, sums, layers.outputs, layers.scratch
        self._compared: Counter[tuple[str, str]] = Counter()
        self._versions: dict[str, list[str]] = {}
        for key, found in ops.items():
            for name in found:
                self._versions.setdefault(name, []).append(key)
        # attached through the layers' streamer: removed with its hooks, also when attaching stops half-way
        for key, found in ops.items():
            taps = [tap for name, calls in found.items() for op in calls for tap in op.taps(layers.keeper(key, name))]
            if taps:
                layers.removers.append(tap_each(next(iter(found.values()))[0].model, taps))
        layers.removers.append(float_ops.watch(float_model, self._compare))

    def new_batch(self) -> None:
        self._compared.clear()

    def _compare(self, name: str, operands: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        for key in self._versions.get(name, ()):
            call = self._compared[key, name]
            self._compared[key, name] += 1
            calls = self.ops[key][name]
            kept = self.outputs.take(key, name, call)
            if kept is None or call >= len(calls):
                continue
            op = calls[call]
            local = split_output(op.local(operands))
            reference = output
            for step in op.then:
                reference = step(reference)
            at = Reference(reference, like=kept.values, scratch=self.scratch)
            propagated, local_sums = self.sums[key][name]
            propagated.add(at, kept, self.scratch)
            local_sums.add(at, local, self.scratch)


def measure_activations(
    float_model: nn.Module,
    quantized_models: Mapping[str, nn.Module],
    data: Iterable[object],
    *,
    metrics: Sequence[str] | None = None,
    structure: ModelStructure | None = None,
    distributed: bool = False,
    ops: bool = True,
) -> dict[str, ActivationComparison]:
    """:func:`compare_activations` for several quantized versions of ``float_model`` in one pass over ``data``.

    Per batch each quantized model runs once, then the float model, and, for the
    local error, each quantized layer (and op) on the float model's input. With
    ``ops=False`` only the layers are compared (one forward fewer, to find the ops). With
    ``distributed=True`` the ranks' sums are added up in rank order, so every
    rank gets the same result.
    """
    exchange = Exchange.of("compare_activations", distributed)
    with sharing_failures(exchange):
        return _measure(float_model, quantized_models, data, metrics, structure, exchange, ops)


def _measure(
    float_model: nn.Module,
    quantized_models: Mapping[str, nn.Module],
    data: Iterable[object],
    metrics: Sequence[str] | None,
    structure: ModelStructure | None,
    exchange: Exchange | None,
    with_ops: bool = True,
) -> dict[str, ActivationComparison]:
    chosen = load_metrics(tuple(DEFAULT if metrics is None else metrics))
    structure = structure if structure is not None else model_structure(float_model)
    layers = {key: quantized_layers(float_model, model, structure) for key, model in quantized_models.items()}
    for key, found in layers.items():
        if not found:
            raise InvalidParameterError(
                "compare_activations",
                "quantized",
                key,
                "a quantized version of the float model: no Linear/Conv of the float model has a counterpart in it",
            )
    points = {
        key: {fqn: _compared_at(layer, structure.chains.get(fqn, ())) for fqn, layer in found.items()}
        for key, found in layers.items()
    }
    batches = iter(data)
    first = next(batches, None)
    if first is not None:
        batches = itertools.chain((first,), batches)
    float_ops, ops = _ops(float_model, quantized_models, first) if with_ops and first is not None else (None, {})
    sums = {
        key: {fqn: (ErrorSums(chosen), ErrorSums(chosen)) for fqn in (*found, *ops.get(key, {}))}
        for key, found in layers.items()
    }
    streamer = _Streamer(float_model, layers, points, sums)
    op_streamer = None
    try:
        if float_ops is not None:
            op_streamer = _OpStreamer(float_model, float_ops, ops, sums, streamer)
        with contextlib.ExitStack() as stack:
            for model in (float_model, *quantized_models.values()):
                stack.enter_context(eval_mode(model))
            stack.enter_context(torch.no_grad())
            layout = FloatLayout()
            for batch in batches:
                compared = False
                while not compared:
                    streamer.new_batch()
                    if op_streamer is not None:
                        op_streamer.new_batch()
                    for model in quantized_models.values():
                        run_batch(model, batch)
                    compared = layout.run(float_model, batch, streamer.outputs)
                    if not compared:  # what the batch added is taken back: it runs again in the usual layout
                        for errors in (errors for found in sums.values() for pair in found.values() for errors in pair):
                            errors.clear()
    finally:
        streamer.remove()
    if exchange is not None:
        _add_up(sums, exchange)
    return {
        key: ActivationComparison(
            layers=tuple(
                LayerActivationComparison(
                    fqn=name,
                    kind=layer.kind.value,
                    quantized_type=layer.quantized_type,
                    quantized=layer.quantized,
                    compared_at=call_site_name(points[key][fqn].label, occurrence),
                    batches=sums[key][name][0].batches,
                    propagated=sums[key][name][0].values(),
                    local=sums[key][name][1].values(),
                )
                for fqn, layer in found.items()
                for occurrence, name in enumerate(_calls_of(fqn, sums[key]))
            ),
            ops=tuple(_op_rows(float_ops, ops.get(key, {}), sums[key]) if float_ops is not None else ()),
        )
        for key, found in layers.items()
    }


def _calls_of(fqn: str, sums: dict[str, tuple[ErrorSums, ErrorSums]]) -> list[str]:
    """The rows of layer ``fqn``: one per call compared (``fc``, ``fc#1``...), the first even where never reached."""
    calls = [fqn]
    while (name := call_site_name(fqn, len(calls))) in sums:
        calls.append(name)
    return calls


def _ops(
    float_model: nn.Module, quantized_models: Mapping[str, nn.Module], example: object
) -> tuple[FloatOps | None, dict[str, dict[str, list[GraphOp]]]]:
    """The float model's op sites and their counterparts in each quantized graph (none: no op rows)."""
    if not any(isinstance(model, torch.fx.GraphModule) for model in quantized_models.values()):
        return None, {}
    float_ops = FloatOps(float_model, example)  # its forward runs in eval mode, without gradients
    return float_ops, {key: quantized_ops(float_ops, model) for key, model in quantized_models.items()}


def _op_rows(
    float_ops: FloatOps, ops: dict[str, list[GraphOp]], sums: dict[str, tuple[ErrorSums, ErrorSums]]
) -> list[LayerActivationComparison]:
    rows = []
    for name, calls in ops.items():
        propagated, local = sums[name]
        if not propagated.batches:
            continue  # never reached with both outputs at hand
        rows.append(
            LayerActivationComparison(
                fqn=name,
                kind=float_ops.kinds[name].value,
                quantized_type=calls[0].quantized_type,
                quantized=any(op.quantized for op in calls),
                compared_at=name + "".join(f"+{type(step).__name__.lower()}" for step in calls[0].then),
                batches=propagated.batches,
                propagated=propagated.values(),
                local=local.values(),
            )
        )
    return rows


def _add_up(sums: dict[str, dict[str, tuple[ErrorSums, ErrorSums]]], exchange: Exchange) -> None:
    """Every rank's sums, in rank order, in place of this rank's own."""
    states = exchange.gather(
        {key: {fqn: (p.state(), q.state()) for fqn, (p, q) in found.items()} for key, found in sums.items()}
    )
    for key, found in sums.items():
        for fqn, pair in found.items():
            fresh = (ErrorSums(pair[0].metrics), ErrorSums(pair[1].metrics))
            for state in states:  # a rank without batches found no ops to compare
                for mine, theirs in zip(fresh, state[key].get(fqn, ())):
                    mine.absorb(theirs)
            found[fqn] = fresh


__all__ = ["compare_activations", "measure_activations"]
