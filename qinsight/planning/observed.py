"""What ``prepare_fx`` observes under a config, asked of ``prepare_fx`` itself: which edges it
quantizes, and which observer each edge shares with others.

FX shares one observer between an op and the ops that keep its qparams (a view, a hardtanh, a
pool), and which ops share depends on the config. With a Linear in float, the view after it
looks for its input's observer through the float Linear and takes the observer of the Linear's
*input*: in MiniLM, the embeddings LayerNorm's output observer then also takes in the key's
outputs and its scale grows by 16%. With MobileNetV2's hardtanhs in float, each conv's output
observer no longer also sees the clamped values. A simulation calibrated once under the default
config has the default's groups, so here each config is prepared (graph work only, a few tenths
of a second) and only the groups the default does not have are calibrated, on the values they
would see: FX observes float values whatever the config, so one float pass over the calibration
data with every other observer out gives them exactly.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Collection, Iterator, Mapping

import torch
from torch import fx, nn

from qinsight.apply.torch_flows import release_fx_graphs
from qinsight.planning.simulate import Edge, QParams, observed_node, observer_mode, observer_nodes, per_tensor_qparams
from qinsight.planning.switches import Mode

Signature = tuple[object, ...]  # an observer group: its kind, and the nodes it observes in graph order
COLLECT_EVERY = 8  # prepared configs between two collections of the ones dropped


class FxObserved:
    """The edges and shared-observer qparams of ``prepare_fx`` under any config, per config.

    ``prepare`` gives the uncalibrated prepared graph of a config; ``calibrate``
    runs the calibration data through a prepared graph; ``default`` is the
    default config's prepared graph, whose groups the simulation has already.
    """

    def __init__(
        self,
        prepare: Callable[[Mapping[str, Mode]], fx.GraphModule],
        calibrate: Callable[[nn.Module], None],
        default: fx.GraphModule,
    ) -> None:
        self._prepare, self._calibrate = prepare, calibrate
        self._default: dict[Edge, Signature] = {}  # the group each edge is in under the default config
        # the default's calibrated observers by group, read only where another config moves an edge
        # into one of them (a histogram's qparams cost a search each)
        self._calibrated_groups: dict[Signature, nn.Module] = {}
        self._known: dict[Signature, QParams | None] = {}  # qparams of groups read or calibrated so far
        members = observer_nodes(default)
        chains = set(members)
        for signature, nodes in _groups(default, members):
            self._calibrated_groups[signature] = default.get_submodule(str(nodes[0].target))
            for node in nodes:
                self._default.update((edge, signature) for edge, chained in _edges_of(node, chains) if not chained)
        self._asked: dict[frozenset[tuple[str, Mode]], tuple[dict[Edge, Mode], dict[Edge, QParams]]] = {}

    def edges(self, modes: Mapping[str, Mode]) -> dict[Edge, Mode]:
        """The mode of every edge FX quantizes when the sites run in ``modes`` (an :data:`EdgeRule`)."""
        return self._ask(modes)[0]

    def qparams(self, modes: Mapping[str, Mode]) -> dict[Edge, QParams]:
        """The qparams of the edges whose observer group differs from the default config's."""
        return self._ask(modes)[1]

    def _ask(self, modes: Mapping[str, Mode]) -> tuple[dict[Edge, Mode], dict[Edge, QParams]]:
        key = frozenset(modes.items())
        found = self._asked.get(key)
        if found is None:
            found = self._observed(self._prepare(modes))
            if len(self._asked) > 1024:  # a search asks for a few hundred configs; bound it anyway
                self._asked.clear()
            self._asked[key] = found
            release_fx_graphs()
            if len(self._asked) % COLLECT_EVERY == 0:
                # a GraphModule and its graph refer to each other: only the cycle collector frees a
                # prepared graph once torch lets go of it, and with a plan's large heap it seldom runs
                gc.collect()
        return found

    def _observed(self, prepared: fx.GraphModule) -> tuple[dict[Edge, Mode], dict[Edge, QParams]]:
        edges: dict[Edge, Mode] = {}
        regrouped: dict[Edge, Signature] = {}  # edges in another group than under the default config
        members = observer_nodes(prepared)
        chains = set(members)
        unknown: dict[Signature, str] = {}
        for signature, nodes in _groups(prepared, members):
            mode = observer_mode(prepared.get_submodule(str(nodes[0].target)))
            if mode is None:
                continue
            moved = False
            for node in nodes:
                for edge, chained in _edges_of(node, chains):
                    edges[edge] = mode
                    if mode is Mode.STATIC and not chained and self._default.get(edge) != signature:
                        regrouped[edge], moved = signature, True
            if moved and signature not in self._known:
                if signature in self._calibrated_groups:
                    self._known[signature] = per_tensor_qparams(self._calibrated_groups[signature])
                else:
                    unknown[signature] = str(nodes[0].target)
        if unknown:  # a group's values do not depend on the config: calibrated once, kept for every config
            self._known.update(self._calibrated(prepared, unknown))
        qparams = {edge: self._known.get(signature) for edge, signature in regrouped.items()}
        return edges, {edge: found for edge, found in qparams.items() if found is not None}

    def _calibrated(self, prepared: fx.GraphModule, groups: Mapping[Signature, str]) -> dict[Signature, QParams | None]:
        """The qparams of new ``groups`` (by one of their observers' names), calibrated with every other
        observer out."""
        kept = {id(prepared.get_submodule(target)) for target in groups.values()}
        for node in observer_nodes(prepared):
            if id(prepared.get_submodule(str(node.target))) not in kept:
                setattr(prepared, str(node.target), nn.Identity())
        self._calibrate(prepared)
        return {signature: per_tensor_qparams(prepared.get_submodule(target)) for signature, target in groups.items()}


@contextlib.contextmanager
def no_stack_traces() -> Iterator[None]:
    """FX's tracer without the Python stack of each node it records (``torch.fx.config``): a fifth
    of a ``prepare_fx`` of MiniLM (0.35 to 0.28 s), for graphs whose edges are read and dropped."""
    saved = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = saved


def _groups(prepared: fx.GraphModule, members: list[fx.Node]) -> Iterator[tuple[Signature, list[fx.Node]]]:
    """Each observer module with the nodes calling it (of the graph's observer nodes, ``members``),
    keyed by what it takes in: its kind and the nodes whose values it observes, in the order it sees
    them."""
    calls: dict[int, list[fx.Node]] = {}  # FX shares an observer as one module under several names
    for node in members:
        calls.setdefault(id(prepared.get_submodule(str(node.target))), []).append(node)
    chains = set(members)
    for nodes in calls.values():
        observer = prepared.get_submodule(str(nodes[0].target))
        kind = (
            type(observer).__name__,
            getattr(observer, "dtype", None),
            getattr(observer, "quant_min", None),
            getattr(observer, "quant_max", None),
            getattr(observer, "is_dynamic", False),
        )
        yield kind + tuple(observed_node(node, chains).name for node in nodes), nodes


def _edges_of(observer: fx.Node, members: Collection[fx.Node]) -> Iterator[tuple[Edge, bool]]:
    """The (producer, consumer) edges an observer node sits on, and whether in a chain of observers
    (``members``): a chain quantizes twice, and its qparams are left as the default's."""
    source = observed_node(observer, members)
    stack = [(user, observer.args[0] is not source) for user in observer.users]
    while stack:
        user, through = stack.pop()
        if user in members:
            stack.extend((nxt, True) for nxt in user.users)
        else:
            yield (source.name, user.name), through


__all__ = ["FxObserved", "no_stack_traces"]
