"""Ops run as FX's converted model runs them: on quantized tensors, with fbgemm's kernels.

Fake quantization in float rounds a few values otherwise than the integer
kernels do (a conv's requantization, an add's, a pool's integer mean, and
ATen's ``quantize_per_tensor`` itself); through MobileNetV2's 53 layers those
single-step differences grow until the simulated and the real model are 12 dB
apart, which drowns the effect of keeping one layer in float. So where the
switches around an op say its inputs and its output are quantized, the op
runs on the quantized tensors: a layer through its converted module, an
add or a mul through ``quantized.add``/``quantized.mul`` with the output's
qparams, any other op (pooling, hardtanh, flatten, cat) on the quantized
tensors themselves. An op that refuses quantized tensors runs in float from
then on, as before.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import torch
from torch import fx, nn

from qinsight.frontends import call_target
from qinsight.planning.switches import Mode, Switch

# Ops whose quantized form takes the output's qparams (what convert_fx lowers them to).
_WITH_OUTPUT_QPARAMS: dict[object, Any] = {
    operator.add: torch.ops.quantized.add,
    torch.add: torch.ops.quantized.add,
    operator.mul: torch.ops.quantized.mul,
    torch.mul: torch.ops.quantized.mul,
}
NOT_RUN = object()  # the op is not run quantized: compute it in float


class QuantizedOps:
    """Which nodes of a simulated FX graph run on quantized tensors, and running them.

    ``switches`` are the simulation's, by node; ``kernels`` the converted
    model's layer modules by name (``call_module`` targets); ``site_of`` names
    the site a node is, where it is one (a site the config keeps in float or
    dynamic runs as before, whatever its neighbours quantize).
    """

    def __init__(
        self,
        model: fx.GraphModule,
        switches: Mapping[fx.Node, Switch],
        kernels: Mapping[str, nn.Module],
        site_of: Mapping[fx.Node, str],
        float_ops: Collection[str],
    ) -> None:
        self.model, self.switches, self.kernels, self.site_of = model, switches, kernels, site_of
        self._refused: set[fx.Node] = set()
        self._running: set[fx.Node] = set()  # the candidates that run quantized in the configured modes
        self._candidates: dict[fx.Node, bool] = {}  # node -> whether its users must be quantized too
        for node in model.graph.nodes:
            if node.op not in ("call_function", "call_method", "call_module") or node in switches:
                continue
            if (
                node.name in float_ops
                or not node.all_input_nodes
                or not all(n in switches for n in node.all_input_nodes)
            ):
                continue
            if node.op == "call_module" and str(node.target) in kernels:
                self._candidates[node] = False  # a layer's kernel quantizes its output itself
            elif node.users and all(user in switches for user in node.users):
                self._candidates[node] = True  # FX quantizes an op whose output it observes
        # a layer's kernel writes its output with the qparams of the switch after it (which a config
        # that shares observers otherwise than the calibrated graph changes: see observed.py)
        self._writes = {
            kernels[str(node.target)]: switches[user]
            for node, needs_users in self._candidates.items()
            if not needs_users and (user := next(iter(node.users), None)) is not None and user in switches
        }
        self._site_nodes: dict[str, list[fx.Node]] = {}
        for node in self._candidates:
            if node in site_of:
                self._site_nodes.setdefault(site_of[node], []).append(node)
        # An op run on quantized tensors without output qparams of its own (a pool, a dropout) keeps its
        # input's: the converted model has no requantization after it, whatever its observer says.
        self._keeps_qparams = {
            node
            for node, needs_users in self._candidates.items()
            if needs_users and node.target not in _WITH_OUTPUT_QPARAMS
        }

    def nodes_of(self, sites: Iterable[str]) -> list[fx.Node]:
        """The nodes of these sites that can run on quantized tensors: a change of a site's mode
        changes how they run, even where no switch around them changes."""
        return [node for site in sites for node in self._site_nodes.get(site, ())]

    def configure(self, modes: Mapping[str, Mode]) -> None:
        """Which candidates run quantized when the sites run in ``modes``: once per configuration
        (the switches set first), not once per node and batch."""
        self._running = {node for node in self._candidates if self._runs(node, modes)}
        for kernel, output in self._writes.items():
            for name, value in (("scale", output.step), ("zero_point", output.zero)):
                held = getattr(kernel, name)
                if isinstance(held, torch.Tensor):  # a LayerNorm keeps its output qparams as buffers
                    held.fill_(value)
                else:
                    setattr(kernel, name, value)

    def run(self, node: fx.Node, values: Mapping[fx.Node, Any]) -> Any:
        """The node's value computed on quantized tensors, or :data:`NOT_RUN` (compute it in float)."""
        if node in self.switches:  # the switch after an op that keeps its input's qparams lets it through
            source = node.args[0]
            if isinstance(source, fx.Node) and source in self._keeps_qparams and source in self._running:
                return values[source]
            return NOT_RUN
        if node not in self._running:
            return NOT_RUN
        outputs = [self.switches[n] for n in node.users] if self._candidates[node] else []
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: self._carrier(n).quantized(values[n]))
        try:
            result = self._call(node, args, kwargs, outputs[0] if outputs else None)
        except Exception:  # the op has no quantized form for these arguments: it runs in float from now on
            self._refused.add(node)
            self._running.discard(node)
            return NOT_RUN
        return result.dequantize() if isinstance(result, torch.Tensor) and result.is_quantized else result

    def _carrier(self, switch_node: fx.Node) -> Switch:
        """The switch whose qparams the value leaving ``switch_node`` carries: its own, or, after ops
        that keep their input's qparams, the switch before them."""
        source = switch_node.args[0]
        while isinstance(source, fx.Node) and source in self._keeps_qparams and source in self._running:
            switch_node = source.all_input_nodes[0]
            source = switch_node.args[0]
        return self.switches[switch_node]

    def _runs(self, node: fx.Node, modes: Mapping[str, Mode]) -> bool:
        """Whether the node runs on quantized tensors under ``modes`` (its switches as they are set)."""
        needs_users = self._candidates.get(node)
        if needs_users is None or node in self._refused:
            return False
        site = self.site_of.get(node)
        # FX lowers dequantize -> op -> quantize around an op that keeps its input's qparams to the op
        # on the quantized tensor whatever the op's own qconfig: such a site kept in float between
        # quantized neighbours still runs quantized (and its output observer is dropped)
        if site is not None and node not in self._keeps_qparams and modes.get(site, Mode.STATIC) is not Mode.STATIC:
            return False
        if not all(self.switches[n].static_per_tensor for n in node.all_input_nodes):
            return False
        return not needs_users or all(self.switches[n].static_per_tensor for n in node.users)

    def _call(self, node: fx.Node, args: Any, kwargs: Any, output: Switch | None) -> Any:
        if node.op == "call_module":
            kernel = self.kernels.get(str(node.target))
            module = kernel if kernel is not None else self.model.get_submodule(str(node.target))
            return module(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], str(node.target))(*args[1:], **kwargs)
        lowered = _WITH_OUTPUT_QPARAMS.get(node.target)
        if lowered is not None:
            if output is None or len(args) != 2 or kwargs or not all(isinstance(a, torch.Tensor) for a in args):
                raise TypeError("not a binary op of two tensors with a quantized output")
            return lowered(args[0], args[1], output.step, output.zero)
        return call_target(node, args, kwargs)


__all__ = ["NOT_RUN", "QuantizedOps"]
