"""Which layer's (or op's) lowered kernel computes otherwise than the reference model, and where that grows.

A lowered program's delegate is one opaque call: nothing inside it can be read.
So each quantized layer and op of a ``convert_pt2e`` reference is lowered
*alone*: the graph's own stretch around it (its inputs' quantize and
dequantize, an int8 weight and its dequantize, the layer or op, a ReLU or
ReLU6 after a layer, the output quantize and dequantize) becomes a module of its
own (:func:`standalone`), with the reference's scales, and is lowered for the
backend.

- **local**: that program against the stretch run as the reference runs it, on
  the inputs the reference gave it: what the backend's kernel does otherwise
  (its int32 accumulation's rounding, a clamp it ignores, an arithmetic that
  saturates), free of what earlier layers did;
- **propagated**: the reference graph with every stretch replaced by its lowered
  program (:func:`hybrid`), each output against the reference's: where one-step
  differences add up. A gap at the model's output that no kernel makes locally
  is this sum (on MobileNetV2 the hybrid is as far from the reference as the
  whole lowered program).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from torch import fx, nn

from qinsight.compare.layers import (
    QDQ_TARGETS,
    QUANTIZE_TARGETS,
    GraphLayer,
    constant_nodes,
    quantized_layers,
    single_user,
)
from qinsight.compare.programs import evaluated_copy, lowered
from qinsight.core.backend import Lowering, Program
from qinsight.core.comparison import LayerParity
from qinsight.core.errors import FrontendError
from qinsight.core.metrics import sqnr_of_sums
from qinsight.frontends import ATEN_OPS, eval_mode, exported_op_names, fetch_attr, tap_each


def stretch_end(last: fx.Node) -> fx.Node:
    """Where a stretch ending at ``last`` (a layer, its ReLU, an op) ends: the dequantize after its output
    quantize. A quantize read by several consumers has a dequantize for each (``convert_pt2e``
    duplicates them); any one of them ends the stretch."""
    if last.target in QDQ_TARGETS:
        return last
    quantize = single_user(last)
    if quantize is None or quantize.target not in QUANTIZE_TARGETS:
        return last  # the output stays in float
    return next((user for user in quantize.users if user.target in QDQ_TARGETS), last)


def _float_source(node: fx.Node) -> fx.Node:
    """The float value behind a dequantize of a quantize (the node itself otherwise)."""
    while node.target in QDQ_TARGETS and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def standalone(model: fx.GraphModule, starts: Sequence[fx.Node], end: fx.Node) -> fx.GraphModule:
    """The stretch of ``model``'s graph from ``starts`` (its inputs) to ``end`` as a module of its
    own: its constants (int8 weights, scales, zero points) are the module's buffers and the ops on
    them are kept, so a backend sees the quantized pattern the whole model has there."""
    root, graph = nn.Module(), fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}

    def copy_of(node: fx.Node) -> fx.Node:
        if node in copies:
            return copies[node]
        if node in starts:
            made = graph.placeholder(f"x{starts.index(node)}")
        elif node.op == "get_attr":
            name, value = f"constant_{len(copies)}", fetch_attr(model, str(node.target))
            if isinstance(value, torch.Tensor):
                root.register_buffer(name, value)
            else:
                setattr(root, name, value)
            made = graph.get_attr(name)
        elif node.op == "call_function":
            for argument in node.all_input_nodes:
                copy_of(argument)
            made = graph.node_copy(node, lambda n: copies[n])
        else:
            raise FrontendError(f"{end.name}: its stretch of graph reads {node.name} ({node.op}), not only its input")
        copies[node] = made
        return made

    for start in starts:  # placeholders first, in the order the stretch is called with
        copy_of(start)
    graph.output(copy_of(end))
    return fx.GraphModule(root, graph)


class _Lowered(nn.Module):
    """A lowered stretch called from the hybrid graph."""

    def __init__(self, program: Program) -> None:
        super().__init__()
        self.program = program

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.program(*inputs)


class Stretch:
    """One quantized layer's or op's stretch of the reference graph: from the float values its input
    quantizes read (``starts``) to its output's dequantize (``end``)."""

    def __init__(self, name: str, kind: str, starts: list[fx.Node], last: fx.Node) -> None:
        self.name, self.kind, self.starts, self.end = name, kind, starts, stretch_end(last)

    @property
    def step(self) -> float | None:
        """The quantization step of the stretch's output (a per-tensor dequantize's scale), if quantized."""
        scale = self.end.args[1] if self.end.target in QDQ_TARGETS and len(self.end.args) > 1 else None
        return scale if isinstance(scale, float) else None


def _op_kind(node: fx.Node) -> str:
    return ATEN_OPS.get(node.target) or str(node.target).removeprefix("aten.").partition(".")[0]


def stretches(float_model: nn.Module, model: fx.GraphModule) -> list[Stretch]:
    """The quantized layers of ``model`` (each Linear/Conv with an int8 weight, with the ReLU fused after)
    and every other op between quantized values (named as the report names its op sites, else by
    its graph node: a ``mean``, a ``flatten``), in graph order."""
    found: dict[fx.Node, Stretch] = {}
    for layer in quantized_layers(float_model, model).values():
        if isinstance(layer, GraphLayer) and layer.quantized:
            found[layer.op] = Stretch(layer.fqn, layer.kind.value, [layer.input_node], layer.output)
    constant, names = constant_nodes(model.graph), exported_op_names(model)
    for node in model.graph.nodes:
        if node.op != "call_function" or node in found or node in constant or node.target in QDQ_TARGETS:
            continue
        inputs = [argument for argument in node.all_input_nodes if argument not in constant]
        if not any(argument.target in QDQ_TARGETS for argument in inputs):
            continue  # inside a layer's stretch (its ReLU), or in float
        starts = list(dict.fromkeys(map(_float_source, inputs)))
        stretch = Stretch(names.get(node, node.name), _op_kind(node), starts, node)
        if stretch.end.target in QDQ_TARGETS:
            found[node] = stretch
    order = {node: index for index, node in enumerate(model.graph.nodes)}
    return [found[node] for node in sorted(found, key=order.__getitem__)]


def hybrid(
    model: fx.GraphModule, lowered_stretches: Sequence[tuple[Stretch, Program]]
) -> tuple[fx.GraphModule, dict[str, fx.Node]]:
    """A copy of ``model`` whose every stretch runs its lowered program, and the node of each stretch's
    output in it. A stretch's output feeds every dequantize of its output quantize, and a later
    stretch that reads the float value before that quantize reads the lowered output instead (the
    same integers: it is quantized again with the same scale)."""
    result = typing.cast(fx.GraphModule, evaluated_copy(model))
    graph = result.graph
    nodes = {node.name: node for node in graph.nodes}
    replaced: dict[str, fx.Node] = {}
    outputs: dict[str, fx.Node] = {}
    for index, (stretch, program) in enumerate(lowered_stretches):
        name = f"qinsight_lowered_{index}"
        result.add_module(name, _Lowered(program))
        end = nodes[stretch.end.name]
        arguments = tuple(replaced.get(start.name, nodes[start.name]) for start in stretch.starts)
        with graph.inserting_after(end):
            call = graph.call_module(name, arguments)
        quantize = end.args[0] if end.target in QDQ_TARGETS else None
        if isinstance(quantize, fx.Node) and quantize.target in QUANTIZE_TARGETS:
            for reader in [user for user in quantize.users if user.target in QDQ_TARGETS]:
                reader.replace_all_uses_with(call)
        else:  # a float output (a last Linear): its readers read the lowered one
            end.replace_all_uses_with(call)
        replaced[_float_source(end).name] = call
        outputs[stretch.name] = call
    graph.eliminate_dead_code()
    result.recompile()
    return result, outputs


def _values(model: fx.GraphModule, nodes: dict[str, fx.Node], inputs: tuple[Any, ...]) -> dict[str, torch.Tensor]:
    """The value of each named node when ``model`` runs on ``inputs``."""
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[[torch.Tensor], None]:
        # contiguous: a lowered program takes its example's memory layout as the one its inputs have
        return lambda value: seen.__setitem__(name, value.detach().contiguous())

    detach = tap_each(model, [(node, keep(name)) for name, node in nodes.items()])
    try:
        with torch.no_grad(), eval_mode(model):
            model(*inputs)
    finally:
        detach()
    return seen


@attrs.define
class _Errors:
    """One output against its reference over batches, as running sums (a model's every activation at
    once would not fit)."""

    signal: float = 0.0  # sum of x²
    noise: float = 0.0  # sum of (x - y)²
    largest: float = 0.0  # max |x - y|
    differing: int = 0
    count: int = 0

    def add(self, expected: torch.Tensor, actual: Any) -> None:
        x = expected.detach().double()
        difference = (x - torch.as_tensor(actual).detach().double()).abs()
        self.signal += float(x.square().sum())
        self.noise += float(difference.square().sum())
        self.largest = max(self.largest, float(difference.max()) if difference.numel() else 0.0)
        self.differing += int((difference > 0).sum())
        self.count += difference.numel()

    @property
    def sqnr(self) -> float:
        return sqnr_of_sums(self.signal, self.noise)


def _parity(stretch: Stretch, local: _Errors, propagated: _Errors, batches: int) -> LayerParity:
    return LayerParity(
        fqn=stretch.name,
        kind=stretch.kind,
        sqnr=local.sqnr,
        propagated=propagated.sqnr,
        max_abs=local.largest,
        step=stretch.step,
        mismatched=local.differing / local.count if local.count else 0.0,
        batches=batches,
    )


@attrs.frozen
class _LoweredStretch:
    stretch: Stretch
    reference: fx.GraphModule
    program: Program
    position: int  # where its inputs are among the captured values


def _lowered_stretches(
    quantized: fx.GraphModule, found: list[Stretch], first: dict[str, torch.Tensor], lowering: Lowering
) -> tuple[list[_LoweredStretch], tuple[str, ...]]:
    """Each stretch lowered for the first batch's values and run on them once; those that cannot be
    (a pattern the backend's lowering refuses) as ``"name: why"``."""
    kept, skipped = [], []
    for position, stretch in enumerate(found):
        inputs = tuple(first[f"{position}:{index}"] for index in range(len(stretch.starts)))
        reference = standalone(quantized, stretch.starts, stretch.end)
        try:
            program = lowered(lowering, reference, inputs, f"{stretch.kind} {stretch.name}")
            program(*inputs)
        except FrontendError as exc:
            skipped.append(f"{stretch.name}: {exc}")
            continue
        kept.append(_LoweredStretch(stretch, reference, program, position))
    return kept, tuple(skipped)


def layer_parities(
    float_model: nn.Module, quantized: fx.GraphModule, batches: Sequence[tuple[Any, ...]], lowering: Lowering
) -> tuple[tuple[LayerParity, ...], tuple[str, ...]]:
    """Each quantized layer and op of ``quantized`` lowered alone against its reference stretch (local),
    and inside the reference with every one lowered (propagated), on ``batches``, worst local first;
    and the stretches that could not be lowered alone, each with why."""
    found = stretches(float_model, quantized)
    starts = {f"{position}:{index}": start for position, s in enumerate(found) for index, start in enumerate(s.starts)}
    kept, skipped = _lowered_stretches(quantized, found, _values(quantized, starts, batches[0]), lowering)
    if not kept:
        return (), skipped
    mixed, mixed_outputs = hybrid(quantized, [(each.stretch, each.program) for each in kept])
    ends = {each.stretch.name: each.stretch.end for each in kept}
    local = {name: _Errors() for name in ends}
    propagated = {name: _Errors() for name in ends}
    for batch in batches:
        values, expected = _values(quantized, starts, batch), _values(quantized, ends, batch)
        with torch.no_grad():
            for each in kept:
                inputs = tuple(values[f"{each.position}:{index}"] for index in range(len(each.stretch.starts)))
                local[each.stretch.name].add(each.reference(*inputs), each.program(*inputs))
        for name, value in _values(mixed, mixed_outputs, batch).items():
            propagated[name].add(expected[name], value)
    parities = [
        _parity(each.stretch, local[each.stretch.name], propagated[each.stretch.name], len(batches)) for each in kept
    ]
    return tuple(sorted(parities, key=lambda parity: parity.sqnr)), skipped


__all__ = ["Stretch", "hybrid", "layer_parities", "standalone", "stretch_end", "stretches"]
