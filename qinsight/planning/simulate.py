"""One calibrated model whose every quantization can be switched: what makes end-to-end sensitivity cheap.

A prepared graph (``prepare_fx`` or ``prepare_pt2e``), calibrated once, holds
an observer on every edge the flow quantizes. Each observer is replaced by a
:class:`Switch` that fake-quantizes with the observer's qparams (or per batch,
for a dynamic site) or passes the value through; weights get their
quantized-dequantized copy, swapped in or out. An observer read by several
consumers becomes one switch per consumer. Which switches are on, and how,
follows from which sites are quantized, as the flow itself says it for each
config (an :data:`EdgeRule`: PT2E's quantizer annotates the graph again, FX
prepares it again); where the flow shares an observer otherwise than in the
calibrated graph, the switch takes that group's qparams (a :data:`Regroup`).

Runs are graph interpretations of one batch that can start where a change
starts: a batch's values under one configuration are kept, and a configuration
that differs in a few sites recomputes only the nodes downstream of them
(in-place ops are made out-of-place first, so no run changes a kept value).
Which configurations run on which batches, and in what order, is
:mod:`.sweep`'s: batch by batch, so memory does not grow with the data.
"""

from __future__ import annotations

import collections
import functools
import operator
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

import torch
from torch import fx, nn
from torch.ao.quantization.observer import ObserverBase

from qinsight.core.errors import FrontendError
from qinsight.frontends import batch_arguments, fetch_attr
from qinsight.planning.kernels import NOT_RUN, QuantizedOps
from qinsight.planning.switches import Mode, Switch

K = TypeVar("K")
V = TypeVar("V")


class Owners:
    """The sites an observed edge belongs to: the site producing it and the sites consuming it (what
    the plan can switch), and whether it is a constant (a weight, quantized once)."""

    def __init__(self, producer: str | None, consumers: Iterable[str], weight: bool) -> None:
        self.producer = producer
        self.consumers = tuple(sorted(set(consumers)))
        self.weight = weight

    @property
    def sites(self) -> tuple[str, ...]:
        return self.consumers + ((self.producer,) if self.producer and not self.weight else ())


WeightSwap = tuple[nn.Module, torch.Tensor, torch.Tensor]  # (holder, float weight, fake-quantized weight)


def _alone(holds: bool) -> bool:
    return holds


class Simulation:
    """A calibrated prepared graph with a switch per observer and a weight swap per FX layer.

    ``owners`` gives each observer node its :class:`Owners`; ``weights`` the FX
    layers' weight swaps by site (PT2E weights are observed in the graph);
    ``edge_rule`` and ``regroup`` are the flow's answers for each config;
    ``real_ops`` builds, from the graph and its switches, the ops that run on
    quantized tensors as the flow's converted model runs them (FX:
    :class:`~qinsight.planning.kernels.QuantizedOps`); with it the switches
    quantize as ATen's ``quantize_per_tensor`` does.
    """

    def __init__(
        self,
        model: fx.GraphModule,
        owners: Callable[[fx.Node], Owners],
        weights: Mapping[str, WeightSwap],
        edge_rule: EdgeRule,
        dynamic_max: int = 255,
        real_ops: RealOps | None = None,
        regroup: Regroup | None = None,
    ) -> None:
        self.model = model
        self.weights = dict(weights)
        self.switches: dict[fx.Node, tuple[Switch, Owners]] = {}
        self.edge_rule, self.regroup = edge_rule, regroup
        _out_of_place(model)
        _one_observer_per_edge(model)
        observers = observer_nodes(model)
        members = set(observers)
        self._edges = {node: _edge(node, members) for node in observers}
        per_edge = collections.Counter(self._edges.values())
        self._regroupable = {node for node, edge in self._edges.items() if per_edge[edge] == 1}  # not in a chain
        for node in observers:
            who = owners(node)
            weight = functools.partial(_weight, model, node.args[0]) if who.weight else None
            switch = Switch(
                model.get_submodule(str(node.target)), dynamic_max=dynamic_max, aten=real_ops is not None, weight=weight
            )
            name = f"{node.name}_switch"  # one per node: the copies of a shared observer switch apart
            model.add_module(name, switch)
            node.target = name
            self.switches[node] = (switch, who)
        model.recompile()
        self.ops = real_ops(model, {node: switch for node, (switch, _) in self.switches.items()}) if real_ops else None
        self.nodes = list(model.graph.nodes)
        self.sites = sorted({site for _, who in self.switches.values() for site in who.sites} | set(self.weights))
        self._weight_users = {
            str(node.target): node
            for node in self.nodes
            if node.op == "call_module" and str(node.target) in self.weights
        }
        self._decided: dict[frozenset[tuple[str, Mode]], dict[fx.Node, tuple[Mode, QParams | None]]] = {}
        self._downstream: dict[frozenset[fx.Node], set[fx.Node]] = {}
        self._kept = self._read_later()
        self._recompute: dict[frozenset[fx.Node], set[fx.Node]] = {}
        self.evaluations = 0.0  # in whole forwards over the data: a partial run counts its share of nodes
        self.memory_budget = MEMORY_BUDGET  # bytes of configs' outputs a sweep holds at once (plan's memory_budget)
        # whether a choice made from this process's batches holds on every rank (a plan over ranks: Ranks)
        self.agree: Callable[[bool], bool] = _alone

    def _states(self, modes: Mapping[str, Mode]) -> dict[fx.Node, tuple[Mode, QParams | None]]:
        """Each switch's mode when the sites run in ``modes``, as the flow says it (``edge_rule``: PT2E's
        quantizer asked again, FX's prepare) and, where the flow shares its observer otherwise than
        in the calibrated graph, its qparams (``regroup``)."""
        key = frozenset(modes.items())
        found = self._decided.get(key)
        if found is None:
            edges = self.edge_rule(modes)
            decided = {node: edges.get(self._edges[node], Mode.FLOAT) for node in self.switches}
            regrouped = self.regroup(modes) if self.regroup is not None else {}
            found = {
                node: (mode, regrouped.get(self._edges[node]) if node in self._regroupable else None)
                for node, mode in decided.items()
            }
            _remember(self._decided, key, found)
        return found

    def configure(self, modes: Mapping[str, Mode]) -> None:
        for node, (mode, qparams) in self._states(modes).items():
            switch = self.switches[node][0]
            switch.mode = mode
            switch.regroup(qparams)
        if self.ops is not None:
            self.ops.configure(modes)
        for site, (holder, float_weight, quantized) in self.weights.items():
            holder.weight.data = float_weight if modes.get(site, Mode.STATIC) is Mode.FLOAT else quantized

    def downstream(self, starts: Iterable[fx.Node]) -> set[fx.Node]:
        key = frozenset(starts)
        if key not in self._downstream:
            found: set[fx.Node] = set()
            stack = list(key)
            while stack:
                node = stack.pop()
                if node not in found:
                    found.add(node)
                    stack.extend(node.users)
            _remember(self._downstream, key, found)
        return self._downstream[key]

    def values(self, modes: Mapping[str, Mode], batch: object, share: float = 1.0) -> BatchValues:
        """``batch`` run under ``modes``: its output and the values later runs may start from; ``share``:
        the batch's share of the data, what the run adds to :attr:`evaluations`."""
        self.configure(modes)
        self.evaluations += share
        with torch.no_grad():  # a weight's autograd graph would keep every value it saw alive with the output
            return BatchValues(dict(modes), self._interpret(batch, None, None))

    def changed(self, modes: Mapping[str, Mode], before: BatchValues, share: float = 1.0) -> BatchValues:
        """``before``'s batch under ``modes``, recomputing only what the sites whose mode changed reach
        (the rest is ``before``'s values); it adds its share of the nodes times ``share`` to :attr:`evaluations`."""
        starts = self._starts(modes, before.modes)
        self.configure(modes)
        recompute = self._recomputed(starts)
        self.evaluations += share * len(recompute) / max(len(self.nodes), 1)
        with torch.no_grad():
            return BatchValues(dict(modes), self._interpret(None, recompute, before.values))

    def _starts(self, modes: Mapping[str, Mode], before: Mapping[str, Mode]) -> list[fx.Node]:
        """The nodes a run under ``modes`` recomputes from one under ``before`` at the least: those whose
        value changes."""
        was, now = self._states(before), self._states(modes)
        starts = [node for node in self.switches if was[node][0] is not now[node][0]]
        starts += [self._requantized(node) for node in self.switches if was[node][1] != now[node][1]]
        starts += [
            node
            for site, node in self._weight_users.items()
            if (modes.get(site, Mode.STATIC) is Mode.FLOAT) != (before.get(site, Mode.STATIC) is Mode.FLOAT)
        ]
        if self.ops is not None:
            changed = {site for site in {*modes, *before} if modes.get(site) is not before.get(site)}
            starts += self.ops.nodes_of(changed)
        return starts

    def _read_later(self) -> set[fx.Node]:
        """The values a run keeps for later runs to start from: the model's inputs and constants, and
        of what some possible start reaches, the values it reads from outside, except a switch's input
        (recomputed from what comes before it, :meth:`_recomputed`). A run keeps about one value
        a layer: MobileNetV2's every value is 110 MB a crop, and a plan on 48 crops outgrew 24 GB."""
        possible = [*self.switches, *self._weight_users.values()]
        if self.regroup is not None:
            possible += [self._requantized(node) for node in self.switches]
        if self.ops is not None:
            possible += self.ops.nodes_of(self.sites)
        bits = {node: 1 << index for index, node in enumerate(dict.fromkeys(possible))}
        reached_by: dict[fx.Node, int] = {}  # the starts that reach each node, as bits: linear in the graph
        for node in self.nodes:  # graph order: a node's inputs come first
            reached_by[node] = functools.reduce(
                operator.or_, (reached_by[a] for a in node.all_input_nodes), bits.get(node, 0)
            )
        # a value is read where a start reaches one of its users and not it
        read = {node for node in self.nodes if any(reached_by[user] != reached_by[node] for user in node.users)}
        read.update(node for node in self.nodes if node.op in ("placeholder", "get_attr"))
        switched = {node.args[0] for node in self.switches}
        return {node for node in read if node not in switched or node.op in ("placeholder", "get_attr")}

    def _recomputed(self, starts: Iterable[fx.Node]) -> set[fx.Node]:
        """The nodes a run from ``starts`` recomputes: what they reach, and what computes a value it
        reads that no run keeps (from the values runs keep)."""
        key = frozenset(starts)
        if key not in self._recompute:
            found = set(self.downstream(key))
            missing = self._unkept_inputs(found, found)
            while missing:
                found |= missing
                missing = self._unkept_inputs(missing, found)
            _remember(self._recompute, key, found)
        return self._recompute[key]

    def _unkept_inputs(self, nodes: Iterable[fx.Node], recomputed: set[fx.Node]) -> set[fx.Node]:
        return {
            arg for node in nodes for arg in node.all_input_nodes if arg not in recomputed and arg not in self._kept
        }

    def _requantized(self, switch: fx.Node) -> fx.Node:
        """Where new qparams of ``switch`` start changing values: at the kernel writing its input where
        ops run on quantized tensors (the kernel writes with its output's qparams), else at the switch
        itself; a model input has no kernel."""
        source = switch.args[0]
        if self.ops is None or not isinstance(source, fx.Node) or source.op == "placeholder":
            return switch
        return source

    def _interpret(
        self, batch: object, recompute: set[fx.Node] | None, cached: dict[Any, Any] | None
    ) -> dict[Any, Any]:
        values: dict[Any, Any] = {}
        inputs = iter(flat_inputs(self.model, batch)) if batch is not None else iter(())
        for node in self.nodes:
            if cached is not None and recompute is not None and node not in recompute:
                if node.op == "output":
                    values[_OUTPUT] = cached[_OUTPUT]
                elif node in cached:
                    values[node] = cached[node]
                continue
            if node.op == "placeholder":
                values[node] = next(inputs)
                continue
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
            if node.op == "output":
                values[_OUTPUT] = self.model.graph._codegen.process_outputs(args[0])
            elif node.op == "get_attr":  # a tensor, or a subgraph a higher-order op calls (autocast, no_grad blocks)
                values[node] = fetch_attr(self.model, str(node.target))
            elif self.ops is not None and (value := self.ops.run(node, values)) is not NOT_RUN:
                values[node] = value
            elif node.op == "call_module":
                values[node] = self.model.get_submodule(str(node.target))(*args, **kwargs)
            elif node.op == "call_function":
                values[node] = node.target(*args, **kwargs)
            else:  # call_method
                values[node] = getattr(args[0], str(node.target))(*args[1:], **kwargs)
        return {node: value for node, value in values.items() if node is _OUTPUT or node in self._kept}


_OUTPUT = "__output__"
MEMORY_BUDGET = 2 << 30  # bytes a plan's simulation may hold beyond one batch's values, unless told: 2 GiB
MEMO_BOUND = 1024  # a search asks for a few hundred configs: each memo of the simulation holds this many at most


def _remember(memo: dict[K, V], key: K, value: V) -> None:
    """``memo[key] = value``, the memo emptied first where it holds :data:`MEMO_BOUND` entries (each of a
    simulation's memos is its own, bounded so: what a config or a set of changed nodes decides)."""
    if len(memo) >= MEMO_BOUND:
        memo.clear()
    memo[key] = value


_IN_PLACE: dict[object, object] = {
    operator.iadd: operator.add,
    operator.imul: operator.mul,
    operator.isub: operator.sub,
    operator.itruediv: operator.truediv,
    torch.relu_: torch.relu,
}


def _out_of_place(model: fx.GraphModule) -> None:
    """No op writes into its input: a cached value must stay what it was for every later run."""
    for module in model.modules():
        if getattr(module, "inplace", False) is True:
            module.inplace = False  # type: ignore[assignment]
    for node in model.graph.nodes:
        if node.kwargs.get("inplace") is True:
            node.kwargs = {**node.kwargs, "inplace": False}
        if node.op == "call_function" and node.target in _IN_PLACE:
            node.target = _IN_PLACE[node.target]
        elif node.op == "call_method" and str(node.target).endswith("_") and not str(node.target).startswith("_"):
            if hasattr(torch.Tensor, str(node.target)[:-1]):
                node.target = str(node.target)[:-1]


def _one_observer_per_edge(model: fx.GraphModule) -> None:
    """An observer node per consumer: where the producer stays in float, the flows quantize the value
    only for the consumers that are quantized (FX's quantize node, PT2E's input annotation), and a
    float consumer reads the float value."""
    for node in observer_nodes(model):
        for user in list(node.users)[1:]:
            with model.graph.inserting_after(node):
                copy = model.graph.call_module(str(node.target), node.args)
            user.replace_input_with(node, copy)


RealOps = Callable[[fx.GraphModule, Mapping[fx.Node, Switch]], QuantizedOps]
"""Builds the ops that run on quantized tensors, from the graph and its switches (FX's)."""

Edge = tuple[str, str]  # (producing node, consuming node) names
QParams = tuple[float, int]  # a per-tensor scale and zero point

EdgeRule = Callable[[Mapping[str, Mode]], Mapping[Edge, Mode]]
"""A flow's own answer to "which edges does it quantize when the sites run in these modes": the
mode of each quantized edge, by (producing node, consuming node) names; edges not named stay float."""

Regroup = Callable[[Mapping[str, Mode]], Mapping[Edge, QParams]]
"""A flow's qparams for the edges whose observer, under these modes, is shared otherwise than in the
calibrated graph (FX's shared observers follow the config): the others keep their switch's own."""


def per_tensor_qparams(observer: nn.Module) -> QParams | None:
    """A calibrated static observer's per-tensor qparams; ``None`` for any other."""
    if observer_mode(observer) is not Mode.STATIC or not hasattr(observer, "calculate_qparams"):
        return None
    scale, zero_point = observer.calculate_qparams()  # type: ignore[operator]
    return (float(scale), int(zero_point)) if scale.numel() == 1 else None


def observer_mode(observer: nn.Module) -> Mode | None:
    """How an observer quantizes what it observes; ``None``: not to an integer type (float16, say)."""
    if getattr(observer, "dtype", None) not in (torch.quint8, torch.qint8, torch.uint8, torch.int8):
        return None
    return Mode.DYNAMIC if getattr(observer, "is_dynamic", False) else Mode.STATIC


def observer_nodes(model: fx.GraphModule) -> list[fx.Node]:
    """The nodes of a prepared graph that call an observer, in graph order."""
    observers = observer_types()
    return [
        node
        for node in model.graph.nodes
        if node.op == "call_module" and isinstance(model.get_submodule(str(node.target)), observers)
    ]


def observed_node(observer: fx.Node, chain: Collection[fx.Node]) -> fx.Node:
    """The node whose value an observer node observes, through chains of observers (an output
    observer followed by a consumer's input observer; ``chain``: the graph's observer nodes)."""
    source = observer
    while source in chain:
        source = observed_input(source)
    return source


def observed_input(observer: fx.Node) -> fx.Node:
    """The node an observer node reads; a graph whose observer reads a constant is one :class:`FrontendError`
    naming it (a plan never ends in a bare assertion on a graph it does not understand)."""
    first = observer.args[0] if observer.args else None
    if not isinstance(first, fx.Node):
        raise FrontendError(
            f"observer node {observer.name!r} reads {type(first).__name__}, not a node of the graph: qinsight cannot "
            "simulate it"
        )
    return first


def _edge(observer: fx.Node, chain: set[fx.Node]) -> Edge:
    """The (producer, consumer) node names of the edge an observer node sits on, through observer chains."""
    source = observed_node(observer, chain)
    consumer = observer
    while consumer in chain and consumer.users:
        consumer = next(iter(consumer.users))
    return source.name, consumer.name if consumer not in chain else ""


def observer_types() -> tuple[type, ...]:
    """torch's observer base, and torchao's where it is loaded (``prepare_pt2e`` inserts torchao's own
    classes; a graph holding them has imported torchao, so an FX-only run never loads it)."""
    torchao_observers = sys.modules.get("torchao.quantization.pt2e.observer")
    if torchao_observers is None:
        return (ObserverBase,)
    return (ObserverBase, torchao_observers.ObserverBase)


class BatchValues:
    """One batch's values under one configuration (``modes``): its output, and the node values a later
    run of the batch may start from (:meth:`Simulation.changed`)."""

    def __init__(self, modes: dict[str, Mode], values: dict[Any, Any]) -> None:
        self.modes, self.values = modes, values

    @property
    def output(self) -> Any:
        return self.values[_OUTPUT]


def _weight(model: fx.GraphModule, node: object) -> torch.Tensor:
    """The weight a weight observer reads: a constant tensor of the graph, else one error naming the node."""
    value = fetch_attr(model, str(node.target)) if isinstance(node, fx.Node) and node.op == "get_attr" else None
    if not isinstance(value, torch.Tensor):
        raise FrontendError(
            f"the plan cannot simulate the weight observed at {node}: it is computed in the graph, not a constant "
            "tensor; "
            "plan this model with flow='fx', or quantize it for real (qinsight.compare_configs)"
        )
    return value


def flat_inputs(model: fx.GraphModule, batch: object) -> list[Any]:
    """The placeholders' values for ``batch``: keyword batches bound by name, pytree inputs flattened."""
    import inspect

    args, kwargs = batch_arguments(batch)
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    flat: list[Any] = model.graph._codegen.process_inputs(*bound.args)
    return list(flat)
