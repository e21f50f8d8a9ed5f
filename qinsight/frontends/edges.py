"""What feeds a site and what reads it, from the FX graph: the facts FX's observer placement
depends on (:attr:`OpSite.source`, :attr:`OpSite.clip`).

FX observes a layer's output once, where the layer and what it fuses end
(Conv-BatchNorm-ReLU), and shares that observer with a clip reading it
(ReLU6, hardtanh): the clip runs on the quantized tensor and keeps its
qparams, so the observer spans the values before the clip. A layer's input
observer is its producer's output observer when the producer is quantized,
else one made from the layer's own qconfig.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs
from torch import fx, nn

from qinsight.core.sites import OpSite
from qinsight.frontends.calls import resolve_target
from qinsight.frontends.modules import call_names, stack_owner, tail_step

_FUSED = (nn.modules.batchnorm._BatchNorm, nn.ReLU)  # what FX folds into the layer before it


def site_nodes(graph: fx.Graph, sites: Iterable[OpSite], owner_of: Callable[[fx.Node], str]) -> dict[fx.Node, str]:
    """The graph's nodes that are sites, by site name: a module's calls by target and which call of it
    (``act``, ``act#1``), functional calls by owner (``owner_of`` a node: the innermost module of a
    trace's stack, or a prepared graph's scope), target and index among that owner's calls of it."""
    known = list(sites)
    modules = {site.fqn for site in known if site.call is None}
    module_calls = call_names(graph)
    calls = {
        (
            site.call.owner,
            site.call.target if site.call.is_method else resolve_target(site.call.target),
            site.call.index,
        ): site.fqn
        for site in known
        if site.call is not None
    }
    names: dict[fx.Node, str] = {}
    counts: dict[tuple[str, object], int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            if module_calls[node] in modules:
                names[node] = module_calls[node]
        elif node.op in ("call_function", "call_method"):
            key = (owner_of(node), node.target)
            index = counts.get(key, 0)
            counts[key] = index + 1
            if (*key, index) in calls:
                names[node] = calls[(*key, index)]
    return names


def _fused_into(model: nn.Module, node: fx.Node) -> bool:
    if node.op != "call_module":
        return node.op in ("call_function", "call_method") and isinstance(_step_module(model, node), nn.ReLU)
    return isinstance(model.get_submodule(str(node.target)), _FUSED)


def _step_module(model: nn.Module, node: fx.Node) -> nn.Module | None:
    step = tail_step(model, node)
    return None if step is None else step[1]


def _clip_after(model: nn.Module, node: fx.Node) -> tuple[float, float] | None:
    """The bounds of the hardtanh (ReLU6) that alone reads ``node``'s output, past what FX fuses."""
    tail = node
    while len(tail.users) == 1:
        (user,) = tail.users
        module = _step_module(model, user)
        if isinstance(module, nn.Hardtanh):
            return float(module.min_val), float(module.max_val)
        if module is None or not _fused_into(model, user):
            return None
        tail = user
    return None


def _source_of(model: nn.Module, node: fx.Node, names: dict[fx.Node, str]) -> str | None:
    """The site producing ``node``'s first input, back through what FX fuses into a layer."""
    inputs = node.all_input_nodes
    producer = inputs[0] if inputs else None
    while producer is not None and producer not in names and _fused_into(model, producer):
        producer = producer.all_input_nodes[0] if producer.all_input_nodes else None
    return names.get(producer) if producer is not None else None


def with_edges(model: nn.Module, graph: fx.Graph, sites: tuple[OpSite, ...]) -> tuple[OpSite, ...]:
    """``sites`` with their ``source`` and ``clip`` read from ``graph`` (a trace of ``model``)."""
    names = site_nodes(graph, sites, stack_owner)
    nodes = {name: node for node, name in names.items()}
    found = []
    for site in sites:
        node = nodes.get(site.fqn)
        if node is None:
            found.append(site)
            continue
        found.append(attrs.evolve(site, source=_source_of(model, node, names), clip=_clip_after(model, node)))
    return tuple(found)


__all__ = ["site_nodes", "with_edges"]
