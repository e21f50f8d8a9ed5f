"""Which observer each edge of a PT2E graph shares under a config, and the qparams of a group the
calibrated simulation does not have.

A PT2E quantizer shares observers: XNNPACK's conv output and the hardtanh after it are one observer
(``SharedQuantizationSpec``: the clamp runs on int8 with its input's qparams), so their scale covers
the conv's values before the clamp. Keep the conv in float and the plan strips its annotation, and
with it what shares it: the hardtanh's output is then observed alone, on the clamped values only,
a finer scale. A simulation calibrated once under the default config has the default's groups; on
MobileNetV2 one conv in float then put the simulated outputs 16 dB away from the real flow's.

So each config's groups are read from the quantizer's own annotation of the graph (torchao's union
of the shared specs, the way ``prepare_pt2e`` builds its observers), and a group the default does not
have is calibrated as ``prepare_pt2e`` would: a new observer of its spec takes, per calibration batch,
each tensor the group observes once, in graph order, as the float values it sees (calibration runs in
float whatever the config). A group depends only on what it observes, so each is calibrated once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import fx

from qinsight.planning.simulate import Edge, QParams, flat_inputs, per_tensor_qparams

Signature = tuple[tuple[object, ...], tuple[str, ...]]  # a group: its observer's kind, the nodes it observes in order


def groups(annotated: fx.GraphModule) -> dict[Edge, tuple[Signature, Any]] | None:
    """The group of every edge ``annotated``'s annotation quantizes, with its spec (the group's own,
    where it shares none); ``None`` where torchao has no union of shared specs to ask (another version)."""
    try:
        from torchao.quantization.pt2e.prepare import _get_edge_or_node_to_group_id, _get_edge_or_node_to_qspec
        from torchao.quantization.pt2e.quantizer import QuantizationSpec
    except ImportError:
        return None
    specs = _get_edge_or_node_to_qspec(annotated)
    ids = _get_edge_or_node_to_group_id(specs)
    order = {node: index for index, node in enumerate(annotated.graph.nodes)}
    observed: dict[int, set[fx.Node]] = {}
    own: dict[int, Any] = {}
    for edge_or_node, group in ids.items():
        observed.setdefault(group, set()).add(edge_or_node[0] if isinstance(edge_or_node, tuple) else edge_or_node)
        spec = specs.get(edge_or_node)
        if isinstance(spec, QuantizationSpec):
            own[group] = spec
    signatures = {
        group: (_kind(own[group]), tuple(node.name for node in sorted(nodes, key=order.__getitem__)))
        for group, nodes in observed.items()
        if group in own
    }
    found: dict[Edge, tuple[Signature, Any]] = {}
    for edge_or_node, group in ids.items():  # an edge's own input spec first, then its producer's output
        if isinstance(edge_or_node, tuple) and group in signatures:
            found[edge_or_node[0].name, edge_or_node[1].name] = (signatures[group], own[group])
    for edge_or_node, group in ids.items():
        if not isinstance(edge_or_node, tuple) and group in signatures:
            for user in edge_or_node.users:
                found.setdefault((edge_or_node.name, user.name), (signatures[group], own[group]))
    return found


def _kind(spec: Any) -> tuple[object, ...]:
    """What an observer made from ``spec`` computes qparams with, beside the values it sees."""
    return (repr(spec.observer_or_fake_quant_ctr), spec.dtype, spec.quant_min, spec.quant_max, spec.qscheme)


class GroupQParams:
    """The qparams of observer groups, each calibrated once on the float values ``graph`` (the
    annotated graph, without observers) computes from the ``calibration`` batches."""

    def __init__(self, graph: fx.GraphModule, calibration: Sequence[object]) -> None:
        self._graph, self._calibration = graph, list(calibration)
        self._known: dict[Signature, QParams | None] = {}

    def __call__(self, wanted: Mapping[Signature, Any]) -> dict[Signature, QParams | None]:
        """The qparams of each group of ``wanted`` (its signature: its spec), calibrated where new."""
        new = {signature: spec for signature, spec in wanted.items() if signature not in self._known}
        if new:
            self._known.update(self._calibrated(new))
        return {signature: self._known[signature] for signature in wanted}

    def _calibrated(self, new: Mapping[Signature, Any]) -> dict[Signature, QParams | None]:
        """New groups' observers, made from their specs as ``prepare_pt2e`` makes them, each taking the
        tensors it observes once per batch in graph order: their per-tensor qparams."""
        from torchao.quantization.pt2e.prepare import _create_obs_or_fq_from_qspec

        observers = {signature: _create_obs_or_fq_from_qspec(spec, {}, False) for signature, spec in new.items()}
        names = {name for _, observed in new for name in observed}
        for batch in self._calibration:
            values = _Capture(self._graph, names).values(batch)
            for (_, observed), observer in observers.items():
                for name in observed:
                    observer(values[name])
        return {signature: per_tensor_qparams(observer) for signature, observer in observers.items()}


class _Capture(fx.Interpreter):
    """``graph`` run in float, the values of the nodes ``names`` kept."""

    def __init__(self, graph: fx.GraphModule, names: set[str]) -> None:
        super().__init__(graph)
        self.names = names
        self.found: dict[str, torch.Tensor] = {}

    def run_node(self, node: fx.Node) -> Any:
        value = super().run_node(node)
        if node.name in self.names:
            self.found[node.name] = value
        return value

    def values(self, batch: object) -> dict[str, torch.Tensor]:
        """The kept values when the graph runs on ``batch``, without gradients."""
        with torch.no_grad():
            self.run(*flat_inputs(self.module, batch))  # type: ignore[arg-type]
        return self.found


__all__ = ["GroupQParams", "Signature", "groups"]
