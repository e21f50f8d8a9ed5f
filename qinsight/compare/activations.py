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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch import nn

from qinsight.compare.accumulate import ErrorSums, KeptOutputs, Reference, Scratch, split_output
from qinsight.compare.layers import QuantizedLayer, dequantize, quantized_layers
from qinsight.compare.layout import FloatLayout
from qinsight.compare.metric_functions import DEFAULT, load_metrics
from qinsight.compare.ops import FloatOps, GraphOp, quantized_ops
from qinsight.core.comparison import ActivationComparison, LayerActivationComparison
from qinsight.core.errors import ComparisonError, InvalidParameterError
from qinsight.core.sites import OpCall, call_site_name, called_module
from qinsight.distributed import Exchange, sharing_failures
from qinsight.frontends import (
    CallIndex,
    CallTap,
    ModelStructure,
    TailChain,
    WatchCall,
    eval_mode,
    hidden_calls,
    model_structure,
    run_batch,
    tap_each,
)


@attrs.frozen
class ComparisonPoint:
    """Where the float output matches a quantized layer's: the output of float module ``module`` (a call
    site's name: ``act#1`` is the second call of ``act``; the layer's own module: ``every_call`` of it),
    then the functional activations the layer absorbed (``F.relu``: no module to hook) applied to it."""

    module: str
    then: tuple[nn.Module, ...] = ()
    every_call: bool = False

    def reached(self, call: int) -> bool:
        """Whether the float forward is at this point when its module's ``call``-th call ends."""
        return self.every_call or call == int(self.module.partition("#")[2] or 0)

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
    point = ComparisonPoint(layer.fqn, every_call=True)  # each of the layer's calls is compared
    for name, module in chain:
        if not layer.absorbs(module):
            break
        if name is None:
            point = attrs.evolve(point, then=(*point.then, module))
        else:
            point = ComparisonPoint(name)
    return point


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
        inner: dict[str, OpCall],
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
            self._attach_float(float_model, inner)
            for key, found in layers.items():
                for fqn, layer in found.items():
                    self.removers.append(layer.attach(self.keeper(key, fqn)))
        except BaseException:
            self.remove()
            raise

    def _attach_float(self, float_model: nn.Module, inner: dict[str, OpCall]) -> None:
        """Each layer's local run where the float forward calls it: at its module's input, or at the
        functional call inside the module (a padding conv's ``F.conv2d``: the input the quantized layer
        reads is the padded one); each comparison point at its module's call."""
        index, tap = CallIndex(float_model), CallTap(float_model)
        for fqn in self._versions:
            if fqn in inner:
                self.removers.append(tap.watch(inner[fqn], self._run_local_call(fqn)))
            else:
                hook = self._run_local(fqn)
                self.removers.append(float_model.get_submodule(fqn).register_forward_pre_hook(hook).remove)
        if any(fqn in inner for fqn in self._versions):
            tap.install()
            self.removers.append(tap.remove)
        for name in dict.fromkeys(called_module(point) for point in self._at):
            module = float_model.get_submodule(name)
            self.removers.append(index.count(module))
            self.removers.append(module.register_forward_hook(self._compare_at(name, index)).remove)

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
            self._local(fqn, args[0])

        return run

    def _run_local_call(self, fqn: str) -> WatchCall:
        def run(operands: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
            self._local(fqn, operands[0])

        return run

    def _local(self, fqn: str, float_input: torch.Tensor) -> None:
        with hidden_calls():  # while op rows are compared, a tap counts the float model's calls
            for key in self._versions[fqn]:
                self.local_outputs.keep(key, fqn, self.layers[key][fqn].local(float_input))

    def _compare_at(self, name: str, index: CallIndex) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        """At the end of each call of module ``name``: the points that call reaches."""
        points = [point for point in self._at if called_module(point) == name]

        def compare(module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
            call = index.running.get(module, 0)
            with hidden_calls():  # a plugin metric's torch calls are not the float model's
                for point in points:
                    self._compare_members(point, output, call)

        return compare

    def _compare_members(self, point: str, output: Any, call: int) -> None:
        # one reference at a time: it may live in the scratch buffer, reused by the next
        for at, members in self._at[point].items():
            if not at.reached(call):
                continue
            reference = None
            for key, fqn in members:
                call = self._compared[key, fqn]
                self._compared[key, fqn] += 1
                kept, local_kept = self.outputs.take(key, fqn, call), self.local_outputs.take(key, fqn, call)
                if kept is None or local_kept is None:
                    continue  # the quantized model did not reach this layer (so often)
                if reference is None:
                    reference = Reference(at.reference(dequantize(output)), like=kept.values, scratch=self.scratch)
                name = call_site_name(fqn, call)
                propagated, local = self._sums(key, name, fqn)
                with _at_site(name, at.label, key):
                    propagated.add(reference, kept, self.scratch)
                    local.add(reference, local_kept, self.scratch)

    def _sums(self, key: str, name: str, fqn: str) -> tuple[ErrorSums, ErrorSums]:
        """The error sums of one call of a layer (a row per call: ``fc``, ``fc#1``), made at its first call."""
        found = self.sums[key]
        if name not in found:
            first = found[fqn][0]
            found[name] = (ErrorSums(first.metrics), ErrorSums(first.metrics))
        return found[name]


@contextlib.contextmanager
def _at_site(name: str, at: str, version: str) -> Iterator[None]:
    """A comparison's shape error as one :class:`ComparisonError` naming the site and where it was read."""
    try:
        yield
    except ComparisonError as exc:
        which = f" of {version}" if version else ""
        raise ComparisonError(
            f"{name}{which} cannot be compared at {at}: {exc}; the two models are not read at the same point "
            "there (a module whose forward holds several ops that the quantized model splits otherwise)"
        ) from exc


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
            with _at_site(name, name, key):
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
    streamer = _Streamer(float_model, layers, points, sums, structure.inner)
    try:
        op_streamer = _OpStreamer(float_model, float_ops, ops, sums, streamer) if float_ops is not None else None
        _stream(float_model, quantized_models, batches, streamer, op_streamer, sums)
    finally:
        streamer.remove()
    if exchange is not None:
        _add_up(sums, exchange)
    return _comparisons(layers, points, sums, float_ops, ops)


def _stream(
    float_model: nn.Module,
    quantized_models: Mapping[str, nn.Module],
    batches: Iterable[object],
    streamer: _Streamer,
    op_streamer: _OpStreamer | None,
    sums: dict[str, dict[str, tuple[ErrorSums, ErrorSums]]],
) -> None:
    """Every batch through the quantized models and then the float one, in eval mode without gradients,
    the streamers adding up the errors (a batch the float model must run in another layout runs again)."""
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


def _comparisons(
    layers: dict[str, dict[str, QuantizedLayer]],
    points: dict[str, dict[str, ComparisonPoint]],
    sums: dict[str, dict[str, tuple[ErrorSums, ErrorSums]]],
    float_ops: FloatOps | None,
    ops: dict[str, dict[str, list[GraphOp]]],
) -> dict[str, ActivationComparison]:
    """Each quantized model's comparison: a row per layer call and per op, from the sums."""
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
