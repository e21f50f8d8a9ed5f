"""The FX frontend: a float ``nn.Module`` (traced for the user) or a ``prepare_fx`` GraphModule.

Sites are the ``call_module`` nodes of the graph whose module is a Linear or a
Conv1d/2d/3d (subclasses included: QAT, lazy, and the Linear/Conv inside a
fused module such as ``LinearReLU``). The site is named after the called
module, which is the float model's name (``fc1``, not ``fc1.0``). The trace is
only read: observers hook the user's own modules, so the model runs as before.
"""

from __future__ import annotations

from torch import fx, nn
from torch.ao.quantization import QConfigMapping

from qinsight.core.errors import FrontendError
from qinsight.core.sites import OpKind, OpSite
from qinsight.frontends.base import ModuleView, module_view
from qinsight.frontends.edges import with_edges
from qinsight.frontends.modules import LeafTracer, call_names, classify, site_for_module
from qinsight.frontends.op_sites import with_ops


def _graph_of(model: nn.Module) -> fx.Graph:
    if isinstance(model, fx.GraphModule):
        return model.graph
    try:
        return LeafTracer().trace(model)
    except Exception as exc:  # tracing fails in many ways: report them all alike
        raise FrontendError(
            f"{type(model).__name__} cannot be FX-traced ({type(exc).__name__}: {exc}); "
            "make the model traceable or pass a prepare_fx GraphModule"
        ) from exc


def module_calls(graph: fx.Graph) -> list[tuple[str, int]]:
    """Each ``call_module`` node of ``graph`` in forward order: the module's name and which of its calls it is."""
    return [(str(node.target), int(name.partition("#")[2] or 0)) for node, name in call_names(graph).items()]


def _unfolded_norms(model: nn.Module, graph: fx.Graph, ops: tuple[OpSite, ...]) -> tuple[OpSite, ...]:
    """``ops`` without the batch norms ``prepare_fx`` folds: those whose input is a Conv module's output.
    The others (after a functional conv, as in a padding Conv2d subclass) it quantizes apart, after
    quantizing the conv's raw output per tensor: sites of their own."""
    folded = set()
    for node, name in call_names(graph).items():
        producer = node.args[0] if node.args else None
        norm = isinstance(model.get_submodule(str(node.target)), nn.modules.batchnorm._BatchNorm)
        if norm and _is_conv_module(model, producer):
            folded.add(name)
    return tuple(op for op in ops if op.kind is not OpKind.BATCH_NORM or op.fqn not in folded)


def _is_conv_module(model: nn.Module, node: object) -> bool:
    if not isinstance(node, fx.Node) or node.op != "call_module":
        return False
    found = classify(model.get_submodule(str(node.target)))
    return found is not None and found[0].is_conv


def fx_view(
    model: nn.Module, qconfig_mapping: QConfigMapping | None = None, example: object | None = None, backend: str = "x86"
) -> ModuleView:
    """The view of an FX-traceable model or of a ``prepare_fx`` GraphModule.

    ``qconfig_mapping`` tells which weight scheme each site would get; a
    prepared model's own ``qconfig`` attributes take precedence. With an
    ``example`` batch the ops around the layers are found too (``view.ops``,
    :func:`~qinsight.frontends.op_sites.op_sites`); not in a ``prepare_fx`` graph,
    whose calls no longer belong to the float model's modules.
    """
    graph = _graph_of(model)
    layers = tuple(
        site_for_module(fqn, module, *found, occurrence, qconfig_mapping)
        for fqn, occurrence in module_calls(graph)
        if (found := classify(module := model.get_submodule(fqn))) is not None
    )
    ops: tuple[OpSite, ...] = ()
    if example is not None and not isinstance(model, fx.GraphModule):
        try:  # every call, functional layer calls included (a padding Conv2d subclass), as the eager frontend
            layers, ops = with_ops(model, example, qconfig_mapping, backend)
        except FrontendError:
            pass  # the batch fails in the model: calibration reports it, as the error of batch 0
        ops = _unfolded_norms(model, graph, ops)
        linked = with_edges(model, graph, layers + ops)
        layers, ops = linked[: len(layers)], linked[len(layers) :]
    return module_view("fx", model, layers, ops)
