"""The ops around the layers in a quantized graph (adds, matmuls, softmax, norms...), matched to the
float model's op sites: one interface for ``convert_fx`` and ``convert_pt2e`` graphs.

Names are the float model's op-site names (``owner.add#0``, or an op module's
call: ``norm``, ``act#1`` for the second call of one ``nn.ReLU6``), found as the frontends find
them (:class:`~qinsight.frontends.Discovery`).
On the quantized side:

- ``convert_pt2e`` keeps each aten node's module stack: the nodes are named
  by :func:`~qinsight.frontends.exported_op_names`, as the exported frontend
  names its sites.
- ``convert_fx`` keeps an op module as a ``call_module`` node of the same
  name, but replaces a functional call with a new node (``quantized.add``)
  that has no module stack. Calls are matched by order instead: FX traced the
  forward in the order it runs, so the k-th tensor add of the graph is the
  k-th add call the float forward makes. Where the counts of a kind differ,
  that kind is not matched (a warning says so) rather than matched wrongly.

An op's output is the value its consumers get: where a quantize follows it
(PT2E's q → dq, FX's ``quantize_per_tensor`` before a quantized consumer),
after it. The local run replays the stretch of graph from where each operand
enters the op (through its quantize or dequantize) to that output on the
float model's operands; an operand that arrived already quantized (FX) is
quantized with the qparams it arrived with.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn

from qinsight.compare.layers import QDQ_TARGETS, QUANTIZE_TARGETS, Arrival, GraphProgram, constant_nodes, walk_tail
from qinsight.core.errors import FrontendError
from qinsight.core.sites import OpCall, OpKind, call_site_name
from qinsight.frontends import (
    OP_NAME_KINDS,
    CallIndex,
    CallTap,
    Discovery,
    WatchCall,
    exported_op_names,
    hidden_calls,
)
from qinsight.plugin import Detach

OnOutput = Callable[[torch.Tensor], None]
OnCall = Callable[[str, tuple[torch.Tensor, ...], torch.Tensor], None]  # (op-site name, operands, output)
_FX_QUANTIZE = {torch.quantize_per_tensor, torch.quantize_per_tensor_dynamic}


def _is_qdq(node: fx.Node) -> bool:
    """A quantize or dequantize node of either flow: the edges an op's operands and output cross."""
    if node.op == "call_method":
        return node.target == "dequantize"
    return node.op == "call_function" and (node.target in QDQ_TARGETS or node.target in _FX_QUANTIZE)


def _is_quantize(node: fx.Node) -> bool:
    return node.op == "call_function" and (node.target in QUANTIZE_TARGETS or node.target in _FX_QUANTIZE)


def _target_name(node: fx.Node) -> str:
    """``add`` for operator.add, torch.add, a ``.add`` method and ``quantized.add``; ``add_relu`` for FX's fused one."""
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", None) or str(target)
    return str(name).rpartition(".")[2]


def _call_kind(node: fx.Node) -> tuple[OpKind, bool] | None:
    """The op kind of an FX call node, and whether FX fused a ReLU into it (``quantized.add_relu``)."""
    if node.op not in ("call_function", "call_method"):
        return None
    name = _target_name(node)
    relu = name.endswith("_relu")
    base = name.removesuffix("_relu").removesuffix("_scalar")
    kind = OP_NAME_KINDS.get(base)
    return (kind, relu) if kind is not None else None


def _shape_values(graph: fx.Graph) -> set[fx.Node]:
    """Nodes holding sizes, not tensors: a traced ``x.shape[0] + 1`` is an add node too."""
    sizes: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "call_function" and node.target is getattr and node.args[1:2] in (("shape",), ("ndim",)):
            sizes.add(node)
        elif node.op == "call_method" and node.target in ("size", "dim", "numel"):
            sizes.add(node)
        elif node.op in ("call_function", "call_method") and node.all_input_nodes:
            if all(arg in sizes for arg in node.all_input_nodes):
                sizes.add(node)
    return sizes


def _flat_nodes(node: fx.Node) -> list[fx.Node]:
    """The nodes among a node's arguments, in argument order (those inside a list too), repeats kept."""
    found: list[fx.Node] = []

    def keep(arg: fx.Node) -> fx.Node:
        found.append(arg)
        return arg

    fx.map_arg((node.args, node.kwargs), keep)
    return found


class GraphOp:
    """One op of a quantized graph, one call of float op site ``name``."""

    def __init__(
        self, model: fx.GraphModule, node: fx.Node, name: str, constant: set[fx.Node], *, fused_relu: bool
    ) -> None:
        self.model, self.node, self.name = model, node, name
        if node.op == "call_module":
            module = model.get_submodule(str(node.target))
            self.quantized_type = f"{type(module).__module__}.{type(module).__qualname__}"
        else:
            self.quantized_type = str(node.target)
        tail = walk_tail(node)
        self.then: tuple[nn.Module, ...] = tuple(_as_module(step) for step in tail) + (
            (nn.ReLU(),) if fused_relu else ()
        )
        end = tail[-1] if tail else node
        self.output = self._leaving(end)
        self.quantized = self.output is not end  # and where FX's output is a quantized tensor: seen on the first run
        self.operands = [arg for arg in _flat_nodes(node) if arg not in constant]
        self.starts = [self._entering(arg) for arg in self.operands]
        self._arrived: dict[fx.Node, Arrival] = {}
        self._program = GraphProgram(model, self.starts, self.output, constant, name)

    @staticmethod
    def _leaving(end: fx.Node) -> fx.Node:
        """Where the value leaves: after the quantize a user puts on it (and PT2E's dequantize after that)."""
        quantize = next((user for user in end.users if _is_quantize(user)), None)
        if quantize is None:
            return end
        dequantize = next((user for user in quantize.users if _is_qdq(user)), None)
        return dequantize if dequantize is not None else quantize

    @staticmethod
    def _entering(operand: fx.Node) -> fx.Node:
        """The node before the quantize/dequantize nodes an operand crosses into the op."""
        while _is_qdq(operand) and isinstance(operand.args[0], fx.Node):
            operand = operand.args[0]
        return operand

    def taps(self, on_output: OnOutput) -> list[tuple[fx.Node, Callable[[torch.Tensor], object]]]:
        """What to tap: the output, for ``on_output``, and each start, for the qparams it arrives with."""

        def output(value: torch.Tensor) -> None:
            self.quantized = self.quantized or value.is_quantized
            on_output(value)

        return [(self.output, output), *((start, self._arrival(start)) for start in dict.fromkeys(self.starts))]

    def _arrival(self, start: fx.Node) -> Callable[[torch.Tensor], None]:
        def arrive(value: torch.Tensor) -> None:
            self._arrived[start] = Arrival.of(value)

        return arrive

    def local(self, operands: Sequence[torch.Tensor]) -> torch.Tensor:
        """The output for the float model's ``operands``, quantized as the op's own operands arrive."""
        starts: dict[fx.Node, object] = {}
        for start, operand in zip(self.starts, operands):
            arrival = self._arrived.get(start)
            starts[start] = operand if arrival is None else arrival.like(operand)
        return self._program.run(starts)


def _as_module(node: fx.Node) -> nn.Module:
    """The float step a PT2E tail node applies: relu, or hardtanh with its bounds."""
    if node.target in (torch.ops.aten.relu.default, torch.ops.aten.relu_.default):
        return nn.ReLU()
    low = node.args[1] if len(node.args) > 1 else -1.0  # aten.hardtanh's defaults
    high = node.args[2] if len(node.args) > 2 else 1.0
    return nn.Hardtanh(float(low), float(high))  # type: ignore[arg-type]


class FloatOps:
    """The float model's op sites, as the frontends find them in one forward on an example batch."""

    def __init__(self, model: nn.Module, example: object) -> None:
        discovery = Discovery(model).run(example)
        # a call of an op module, by its site's name (``act``, ``act#1``) -> the module's name
        self.module_of: dict[str, str] = {call.name: call.fqn for call in discovery.module_calls}
        self.modules: dict[str, OpKind] = {call.name: discovery.kinds[call.fqn] for call in discovery.module_calls}
        self.calls: dict[OpCall, OpKind] = {  # a layer's functional call is a layer row, not an op's
            call: kind for call, (kind, _rank) in discovery.tap.seen.items() if not kind.is_layer
        }
        self.kinds: dict[str, OpKind] = self.modules | {call.name: kind for call, kind in self.calls.items()}

    def watch(self, model: nn.Module, on_call: OnCall) -> Detach:
        """Calls ``on_call(name, operands, output)`` for every call of every op site, until the detach."""
        tap, index = CallTap(model), CallIndex(model)
        removers: list[Callable[[], None]] = []
        for call in self.calls:
            removers.append(tap.watch(call, _call_watcher(call.name, on_call)))
        for fqn in dict.fromkeys(self.module_of.values()):
            module = model.get_submodule(fqn)
            removers.append(index.count(module))
            removers.append(module.register_forward_hook(_module_watcher(fqn, index, on_call)).remove)
        tap.install()
        removers.append(tap.remove)

        def detach() -> None:
            for remove in removers:
                remove()

        return detach


def _call_watcher(name: str, on_call: OnCall) -> WatchCall:
    def watch(operands: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        on_call(name, operands, output)

    return watch


def _module_watcher(fqn: str, index: CallIndex, on_call: OnCall) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
    def watch(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, torch.Tensor):
            name = call_site_name(fqn, index.running.get(module, 0))
            with hidden_calls():  # the local runs are not the float model's calls
                on_call(name, tuple(a for a in args if isinstance(a, torch.Tensor)), output)

    return watch


def quantized_ops(float_ops: FloatOps, quantized_model: nn.Module) -> dict[str, list[GraphOp]]:
    """The ops of a ``convert_fx`` or ``convert_pt2e`` graph, by float op-site name, one per call in run order.

    Empty for a model that is not a graph (eager conversion keeps no record of its functional calls).
    """
    if not isinstance(quantized_model, fx.GraphModule):
        return {}
    named = exported_op_names(quantized_model)
    matched = _by_module_stack(named, float_ops) if named else _by_order(quantized_model, float_ops)
    constant = constant_nodes(quantized_model.graph)
    found: dict[str, list[GraphOp]] = {}
    failed: list[str] = []
    for name, nodes in matched.items():
        for node, fused_relu in nodes:
            try:
                found.setdefault(name, []).append(GraphOp(quantized_model, node, name, constant, fused_relu=fused_relu))
            except FrontendError:
                failed.append(name)
                found.pop(name, None)
                break
    if failed:
        warnings.warn(f"no local run for {len(failed)} ops, not compared: {', '.join(failed[:5])}", stacklevel=3)
    return found


def _by_module_stack(named: dict[fx.Node, str], float_ops: FloatOps) -> dict[str, list[tuple[fx.Node, bool]]]:
    wanted = float_ops.kinds.keys()
    matched: dict[str, list[tuple[fx.Node, bool]]] = {}
    for node, name in named.items():
        if name in wanted:
            matched.setdefault(name, []).append((node, False))
    return matched


def _by_order(model: fx.GraphModule, float_ops: FloatOps) -> dict[str, list[tuple[fx.Node, bool]]]:
    """FX: op modules by name; calls by kind and order (see the module docstring)."""
    matched: dict[str, list[tuple[fx.Node, bool]]] = {}
    in_graph: dict[OpKind, list[tuple[fx.Node, bool]]] = {}
    sizes = _shape_values(model.graph)
    module_calls: Counter[str] = Counter()
    for node in model.graph.nodes:
        if node.op == "call_module" and node.target in float_ops.module_of.values():
            name = call_site_name(str(node.target), module_calls[str(node.target)])
            module_calls[str(node.target)] += 1
            matched.setdefault(name, []).append((node, False))
        elif node not in sizes and (kind_relu := _call_kind(node)) is not None:
            in_graph.setdefault(kind_relu[0], []).append((node, kind_relu[1]))
    unmatched = []
    for kind in dict.fromkeys(float_ops.calls.values()):
        calls = [call for call, of_kind in float_ops.calls.items() if of_kind is kind]
        nodes = in_graph.get(kind, [])
        if len(calls) != len(nodes):
            unmatched.append(f"{kind.value} ({len(calls)} calls, {len(nodes)} graph nodes)")
            continue
        for call, node in zip(calls, nodes):
            matched[call.name] = [node]
    if unmatched:
        warnings.warn(
            f"ops not compared, the FX graph does not match the float forward: {'; '.join(unmatched)}", stacklevel=4
        )
    return matched


__all__ = ["FloatOps", "GraphOp", "quantized_ops"]
