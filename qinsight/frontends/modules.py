"""What a model is made of, as the flows see it: quantizable modules, their kinds and qconfigs, fusable tails.

Every frontend and the comparison read models through these functions, so
"which modules are Linear/Conv layers" and "what follows a layer that a flow
may fuse into it" have one answer.
"""

from __future__ import annotations

import re

import attrs
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.ao.nn.intrinsic.modules.fused import _FusedModule
from torch.ao.quantization import FakeQuantize, QConfig, QConfigMapping
from torch.ao.quantization.observer import ObserverBase

from qinsight.core.sites import OpCall, OpKind, OpSite, WeightScheme, call_site_name, called_module
from qinsight.frontends.calls import LAYER_TARGETS

MODULE_KINDS: tuple[tuple[type[nn.Module], OpKind], ...] = (
    (nn.Linear, OpKind.LINEAR),
    (nn.Conv1d, OpKind.CONV1D),
    (nn.Conv2d, OpKind.CONV2D),
    (nn.Conv3d, OpKind.CONV3D),
)


# Modules the flows quantize around the layers (FX's native backend config has patterns for them).
OP_MODULE_KINDS: tuple[tuple[type[nn.Module], OpKind], ...] = (
    (nn.LayerNorm, OpKind.LAYER_NORM),
    (nn.GroupNorm, OpKind.GROUP_NORM),
    (nn.modules.batchnorm._BatchNorm, OpKind.BATCH_NORM),  # a site only where FX does not fold it
    (nn.Embedding, OpKind.EMBEDDING),
    (nn.EmbeddingBag, OpKind.EMBEDDING),
    (nn.Softmax, OpKind.SOFTMAX),
    (nn.Hardtanh, OpKind.HARDTANH),  # ReLU6 included
    (nn.GELU, OpKind.GELU),
    (nn.SiLU, OpKind.SILU),
    (nn.Sigmoid, OpKind.SIGMOID),
    (nn.modules.pooling._AvgPoolNd, OpKind.POOL),
    (nn.modules.pooling._MaxPoolNd, OpKind.POOL),
    (nn.modules.pooling._AdaptiveAvgPoolNd, OpKind.POOL),
    (nn.RNNCellBase, OpKind.RNN_CELL),
    (nn.RNNBase, OpKind.RNN_CELL),
)


def classify_op(module: nn.Module) -> OpKind | None:
    """The kind of a module that is an op site without being a Linear/Conv (LayerNorm, ReLU6, ...)."""
    return next((kind for cls, kind in OP_MODULE_KINDS if isinstance(module, cls)), None)


def classify(module: nn.Module) -> tuple[OpKind, nn.Module] | None:
    """The op kind of ``module`` and the module holding its weight, if it is a site."""
    # QAT fused modules (ConvBnReLU2d) are Convs themselves; inference fused
    # modules (LinearReLU) hold theirs as the first child.
    candidates = (module, module[0]) if isinstance(module, _FusedModule) else (module,)
    for candidate in candidates:
        for cls, kind in MODULE_KINDS:
            if isinstance(candidate, cls):
                return kind, candidate
    return None


def weight_scheme(qconfig: object) -> WeightScheme | None:
    """What ``qconfig`` does with a weight, with torch's ModelReport's rule."""
    if not isinstance(qconfig, QConfig):
        return None
    weight_obs = qconfig.weight()
    if isinstance(weight_obs, FakeQuantize):
        per_channel = bool(getattr(weight_obs, "is_per_channel", False))
    else:
        per_channel = isinstance(weight_obs, ObserverBase) and hasattr(weight_obs, "ch_axis")
    return WeightScheme.PER_CHANNEL if per_channel else WeightScheme.PER_TENSOR


_GLOBAL = object()


def resolve_qconfig(mapping: QConfigMapping, fqn: str, module_type: type, fallback: object = _GLOBAL) -> object:
    """The qconfig ``mapping`` gives module ``fqn``.

    Precedence as in torch: module name (the module or its closest named
    parent), then name regex, then object type, then ``fallback`` (the global qconfig).
    """
    parts = fqn.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in mapping.module_name_qconfigs:
            return mapping.module_name_qconfigs[prefix]
    for pattern, qconfig in mapping.module_name_regex_qconfigs.items():
        if re.match(pattern, fqn):
            return qconfig
    for object_type, qconfig in mapping.object_type_qconfigs.items():
        if module_type in (object_type,):  # a plain `is` test narrows Callable | str to Never in mypy
            return qconfig
    return mapping.global_qconfig if fallback is _GLOBAL else fallback


class LeafTracer(fx.Tracer):
    """FX's tracer, but fused modules (``LinearReLU``, ...) stay leaves, as in ``prepare_fx``."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _FusedModule) or super().is_leaf_module(m, module_qualified_name)


def site_for_module(
    fqn: str, module: nn.Module, kind: OpKind, holder: nn.Module, occurrence: int, mapping: QConfigMapping | None
) -> OpSite:
    """The site of one call of a module (``occurrence``: which of its calls in a forward); its weight
    scheme from the module's qconfig, else from ``mapping``."""
    qconfig = getattr(module, "qconfig", None)
    if qconfig is None and mapping is not None:
        qconfig = resolve_qconfig(mapping, fqn, type(holder))
    return OpSite(
        fqn=call_site_name(fqn, occurrence),
        occurrence=occurrence,
        kind=kind,
        module_type=type(module).__name__,
        groups=int(getattr(holder, "groups", 1)),
        weight_scheme=weight_scheme(qconfig),
    )


@attrs.frozen
class QuantizableModule:
    """A Linear/Conv module of a model: the module called, its kind, and the module holding its weight
    (the Linear inside a fused ``LinearReLU``)."""

    module: nn.Module
    kind: OpKind
    holder: nn.Module


def quantizable_modules(model: nn.Module) -> dict[str, QuantizableModule]:
    """Each Linear/Conv of ``model`` by name, not descending into one
    (the Linear inside a LinearReLU is not a site of its own)."""
    found: dict[str, QuantizableModule] = {}
    for fqn, module in model.named_modules():
        classified = classify(module)
        if fqn and classified is not None and not any(fqn.startswith(f"{known}.") for known in found):
            found[fqn] = QuantizableModule(module, *classified)
    return found


TAIL_TYPES = (nn.modules.batchnorm._BatchNorm, nn.ReLU, nn.ReLU6, nn.Hardtanh)


# A tail step: the module's name and the module; a functional activation (``F.relu(x)``)
# has no name (``None``) and stands as the module that computes the same.
TailChain = tuple[tuple[str | None, nn.Module], ...]


def _functional_tail(node: fx.Node) -> nn.Module | None:
    """The module equivalent of a functional activation a flow may fuse (F.relu, torch.relu, F.relu6, F.hardtanh)."""
    if node.op == "call_method":
        return nn.ReLU() if node.target in ("relu", "relu_") else None
    if node.op != "call_function" or len(node.args) < 1:
        return None
    if node.target in (F.relu, torch.relu, torch.relu_):
        return nn.ReLU()
    if node.target is F.relu6:
        return nn.ReLU6()
    if node.target in (F.hardtanh, F.hardtanh_):
        bounds = dict(zip(("min_val", "max_val"), node.args[1:3]), **node.kwargs)
        low, high = bounds.get("min_val", -1.0), bounds.get("max_val", 1.0)
        return nn.Hardtanh(low, high) if isinstance(low, (int, float)) and isinstance(high, (int, float)) else None
    return None


def tail_step(model: nn.Module, node: fx.Node) -> tuple[str | None, nn.Module] | None:
    if node.op == "call_module":
        module = model.get_submodule(str(node.target))
        return (str(node.target), module) if isinstance(module, TAIL_TYPES) else None
    functional = _functional_tail(node)
    return None if functional is None else (None, functional)


def tail_chains(model: nn.Module) -> dict[str, TailChain]:
    """Linear/Conv name -> the BatchNorm/ReLU steps that follow it, each the only user of the last.

    Quantization may fuse these into the layer. Which of them it did depends on
    the flow (FX fuses ReLU, also ``F.relu``, but not ReLU6; PT2E quantizes after
    either), so the quantized layer decides (:meth:`QuantizedLayer.absorbs`). A
    step is named as its call's site (``act#1``: the second call of one ReLU6). A
    layer read at its functional call (:func:`inner_calls`) chains from that call.
    """
    graph = _trace(model)
    return {} if graph is None else _chains(model, graph)


def _trace(model: nn.Module) -> fx.Graph | None:
    try:
        return LeafTracer().trace(model)
    except Exception:  # untraceable: compare at the layer itself
        return None


def _chains(model: nn.Module, graph: fx.Graph) -> dict[str, TailChain]:
    names = call_names(graph)
    inner = {node: fqn for fqn, node in _inner_nodes(model, graph).items()}
    chains: dict[str, TailChain] = {}
    for node in graph.nodes:
        if node.op != "call_module" and node not in inner:
            continue
        chain: list[tuple[str | None, nn.Module]] = []
        tail = node
        while len(tail.users) == 1 and (step := tail_step(model, next(iter(tail.users)))) is not None:
            (tail,) = tail.users
            chain.append((names[tail] if step[0] is not None else None, step[1]))
        if chain:
            chains[inner.get(node, str(node.target))] = tuple(chain)
    return chains


def call_names(graph: fx.Graph) -> dict[fx.Node, str]:
    """Each ``call_module`` node's site name: its module's, ``#n`` for the module's n-th later call."""
    calls: dict[str, int] = {}
    names = {}
    for node in graph.nodes:
        if node.op == "call_module":
            occurrence = calls.get(str(node.target), 0)
            calls[str(node.target)] = occurrence + 1
            names[node] = call_site_name(str(node.target), occurrence)
    return names


def _inner_nodes(model: nn.Module, graph: fx.Graph) -> dict[str, fx.Node]:
    """Linear/Conv name -> the functional call its own forward makes on its weight (a padding Conv2d
    subclass: a pad, then ``F.conv2d``), where a trace went into the module."""
    layers = quantizable_modules(model)
    found: dict[str, fx.Node] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in LAYER_TARGETS or len(node.args) < 2:
            continue
        weight = node.args[1]
        if isinstance(weight, fx.Node) and weight.op == "get_attr":
            owner = str(weight.target).rpartition(".")[0]
            if owner in layers and stack_owner(node) == owner:
                found.setdefault(owner, node)
    return found


@attrs.frozen
class ModelStructure:
    """A float model's quantizable modules, their tail chains, and the layers read at a functional call
    inside their own forward (``inner``: name -> the call, :class:`OpCall`), read once and shared by
    comparisons."""

    modules: dict[str, QuantizableModule]
    chains: dict[str, TailChain]
    inner: dict[str, OpCall] = attrs.field(factory=dict)

    def batchnorm_after_conv(self) -> dict[str, str]:
        """conv name -> name of the BatchNorm that is its only user (the start of its tail chain)."""
        return {
            fqn: called_module(name)
            for fqn, ((name, first), *_rest) in self.chains.items()
            if fqn in self.modules
            and isinstance(self.modules[fqn].module, nn.modules.conv._ConvNd)
            and isinstance(first, nn.modules.batchnorm._BatchNorm)
            and name is not None
        }


def model_structure(model: nn.Module) -> ModelStructure:
    """:func:`quantizable_modules`, :func:`tail_chains` and the layers' functional calls (one trace)."""
    graph = _trace(model)
    if graph is None:
        return ModelStructure(modules=quantizable_modules(model), chains={})
    inner = {fqn: _as_call(node, graph) for fqn, node in _inner_nodes(model, graph).items()}
    return ModelStructure(modules=quantizable_modules(model), chains=_chains(model, graph), inner=inner)


def stack_owner(node: fx.Node) -> str:
    """The innermost module of a traced node's stack (``""``: the root's own code)."""
    stack = list((node.meta.get("nn_module_stack") or {}).keys())
    return str(stack[-1]) if stack else ""


def _as_call(node: fx.Node, graph: fx.Graph) -> OpCall:
    """The call a functional layer node is, as a :class:`~qinsight.frontends.calls.CallTap` names it."""
    owner = stack_owner(node)
    same = [n for n in graph.nodes if n.op == "call_function" and n.target is node.target and stack_owner(n) == owner]
    return OpCall(owner=owner, target=LAYER_TARGETS[node.target][0], index=same.index(node))  # type: ignore[index]
