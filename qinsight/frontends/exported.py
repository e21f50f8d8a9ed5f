"""The exported-graph frontend: ``torch.export`` programs, their ``.module()``, and ``prepare_pt2e`` graphs.

Layers are aten ``call_function`` nodes here, not modules, so hooks cannot see
them. Sites are the ``aten.linear`` and ``aten.conv1d/2d/3d`` nodes, named after
the module that owns their weight (``fc1`` for ``fc1.weight``), which is the
name the float model and the FX frontend use. A functional ``F.linear`` on a
module's parameter is a site too (torch's ModelReport cannot see it). Nodes
sharing a weight are one site called several times. In a ``prepare_pt2e``
graph the weight arrives through the quantizer's weight observer (BatchNorm
already folded into it), and that observer's ``qscheme`` tells whether the
weight is quantized per channel.

Observing inserts a tap node (a ``call_module`` of a small module that calls
the observer) after the observed value and recompiles. Detaching erases the
taps and recompiles, which gives back the same graph and code.
"""

from __future__ import annotations

import itertools
import pydoc
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from torch import fx, nn
from torch.ao.quantization import QConfigMapping

from qinsight.core.errors import FrontendError
from qinsight.core.sites import OpKind, OpSite, Side, WeightScheme, call_site_name
from qinsight.frontends.base import ModelViewBase
from qinsight.frontends.modules import OP_MODULE_KINDS, resolve_qconfig, weight_scheme
from qinsight.plugin.detector import Detach

aten = torch.ops.aten
ATEN_KINDS: dict[object, OpKind] = {
    aten.linear.default: OpKind.LINEAR,
    aten.conv1d.default: OpKind.CONV1D,
    aten.conv2d.default: OpKind.CONV2D,
    aten.conv3d.default: OpKind.CONV3D,
}
_MODULE_TYPES: dict[OpKind, type[nn.Module]] = {
    OpKind.LINEAR: nn.Linear,
    OpKind.CONV1D: nn.Conv1d,
    OpKind.CONV2D: nn.Conv2d,
    OpKind.CONV3D: nn.Conv3d,
}
_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric)
_GROUPS_ARG = 6  # aten.convNd(input, weight, bias, stride, padding, dilation, groups)


def _is_observer(node: fx.Node, model: fx.GraphModule) -> bool:
    return node.op == "call_module" and hasattr(model.get_submodule(str(node.target)), "calculate_qparams")


def weight_argument(node: fx.Node) -> object:
    """The weight argument of an aten linear/conv node, positional or keyword."""
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")


def fetch_attr(model: fx.GraphModule, target: str) -> object:
    """What a get_attr node of ``model`` reads (a dotted path of attributes)."""
    value: object = model
    for part in target.split("."):
        value = getattr(value, part)
    return value


def call_target(node: fx.Node, args: Any, kwargs: Any) -> Any:
    """A ``call_function`` node's target called on ``args`` and ``kwargs`` (the values of its inputs)."""
    target: Callable[..., Any] = node.target  # type: ignore[assignment]  # a call_function's target is callable
    return target(*args, **kwargs)


def _weight_source(node: fx.Node, model: fx.GraphModule) -> tuple[fx.Node | None, nn.Module | None]:
    """The get_attr node a weight argument comes from, and the weight observer it passed, if any."""
    weight = weight_argument(node)
    observer = None
    if isinstance(weight, fx.Node) and _is_observer(weight, model):
        observer = model.get_submodule(str(weight.target))
        weight = weight.args[0]
    return (weight if isinstance(weight, fx.Node) and weight.op == "get_attr" else None), observer


def layer_name(node: fx.Node, model: fx.GraphModule) -> str:
    """The float model's name of an aten linear/conv node: the module owning its weight."""
    return module_name_of(node, _weight_source(node, model)[0])


def module_name_of(node: fx.Node, weight: fx.Node | None = None) -> str:
    """The float model's name for an aten op: the module owning its weight, else the innermost module of its stack."""
    if weight is not None:
        return str(weight.target).rpartition(".")[0] or str(weight.target)
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return node.name
    path = str(list(stack.values())[-1][0])
    return path.removeprefix("L['self'].")


# The aten ops of the ops around the layers, by the name FX gives their call (``operator.add`` -> "add").
ATEN_OPS: dict[object, str] = {
    aten.add.Tensor: "add",
    aten.add_.Tensor: "add",
    aten.mul.Tensor: "mul",
    aten.mul_.Tensor: "mul",
    aten.cat.default: "cat",
    aten.matmul.default: "matmul",
    aten.bmm.default: "bmm",
    aten.softmax.int: "softmax",
    aten._softmax.default: "softmax",
    aten.layer_norm.default: "layer_norm",
    aten.group_norm.default: "group_norm",
    aten.embedding.default: "embedding",
    aten.hardtanh.default: "hardtanh",
    aten.hardtanh_.default: "hardtanh",
    aten.gelu.default: "gelu",
    aten.silu.default: "silu",
    aten.sigmoid.default: "sigmoid",
    aten.avg_pool2d.default: "avg_pool2d",
    aten.max_pool2d.default: "max_pool2d",
    aten.adaptive_avg_pool2d.default: "adaptive_avg_pool2d",
}


def _subclasses(cls: type) -> list[type]:
    direct: list[type] = cls.__subclasses__()
    return [sub for child in direct for sub in (child, *_subclasses(child))]


OP_NAME_KINDS: dict[str, OpKind] = {
    "add": OpKind.ADD,
    "mul": OpKind.MUL,
    "cat": OpKind.CAT,
    "matmul": OpKind.MATMUL,
    "bmm": OpKind.MATMUL,
    "softmax": OpKind.SOFTMAX,
    "layer_norm": OpKind.LAYER_NORM,
    "group_norm": OpKind.GROUP_NORM,
    "embedding": OpKind.EMBEDDING,
    "hardtanh": OpKind.HARDTANH,
    "gelu": OpKind.GELU,
    "silu": OpKind.SILU,
    "sigmoid": OpKind.SIGMOID,
    "avg_pool2d": OpKind.POOL,
    "max_pool2d": OpKind.POOL,
    "adaptive_avg_pool2d": OpKind.POOL,
}


_OP_MODULE_NAMES = frozenset(cls.__name__ for base, _ in OP_MODULE_KINDS for cls in (base, *_subclasses(base)))


def exported_op_names(model: fx.GraphModule) -> dict[fx.Node, str]:
    """The aten op nodes of the ops around the layers, named as the FX and eager frontends name their sites.

    An op inside one of torch's modules (``aten.layer_norm`` of ``nn.LayerNorm``)
    is a call of that module's (``act``, ``act#1`` for one ReLU6 called twice); a functional
    call is ``owner.op#index``, counted per owner and op in graph order. aten does not tell ``x + y``
    from ``torch.add(x, y)``, which FX numbers apart: a module using both forms can
    number its adds differently here.
    """
    return {node: name for node, (name, _occurrence) in _op_calls(model).items()}


def _op_calls(model: fx.GraphModule) -> dict[fx.Node, tuple[str, int]]:
    """:func:`exported_op_names`, each with which call of its module it is (0 for a functional call)."""
    names: dict[fx.Node, tuple[str, int]] = {}
    counts: Counter[tuple[str, str]] = Counter()
    module_calls: Counter[str] = Counter()
    for node in model.graph.nodes:
        op = ATEN_OPS.get(node.target) if node.op == "call_function" else None
        if op is None:
            continue
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        owner, owner_type = (str(stack[-1][0]).removeprefix("L['self']."), str(stack[-1][1])) if stack else ("", "")
        if owner_type.startswith(("torch.nn.", "<class 'torch.nn.")):
            if owner_type.strip("<class '>").rpartition(".")[2] in _OP_MODULE_NAMES:
                names[node] = (call_site_name(owner, module_calls[owner]), module_calls[owner])
                module_calls[owner] += 1
            continue  # inside another of torch's modules (MultiheadAttention): FX does not see it either
        index = counts[owner, op]
        counts[owner, op] = index + 1
        names[node] = (f"{owner}.{op}#{index}" if owner else f"{op}#{index}", 0)
    return names


def layer_names(model: fx.GraphModule) -> dict[fx.Node, str]:
    """The aten Linear/Conv nodes, each a site named after the module owning its weight (a second call
    of the module, ``fc#1``, :func:`~qinsight.core.sites.call_site_name`)."""
    return {node: name for node, (name, _occurrence) in _layer_calls(model).items()}


def _layer_calls(model: fx.GraphModule) -> dict[fx.Node, tuple[str, int]]:
    calls: Counter[str] = Counter()
    names = {}
    for node in exported_sites(model):
        module = layer_name(node, model)
        names[node] = (call_site_name(module, calls[module]), calls[module])
        calls[module] += 1
    return names


def exported_site_names(model: fx.GraphModule) -> dict[fx.Node, str]:
    """Every site node of an exported graph (layers and the ops around them) by its site's name."""
    return {**exported_op_names(model), **layer_names(model)}


def separate_shared_calls(model: fx.GraphModule) -> fx.GraphModule:
    """Give each call of a module called more than once (one ``nn.ReLU`` reused) its own source partition.

    torchao's quantizers group an exported graph's nodes by the module that made
    them (``get_source_partitions``), so every call of a shared module lands in
    one partition with several outputs, and X86InductorQuantizer's conv/linear
    fusions raise "Input partition has more than one output node"
    (pytorch/ao#4478; torchvision's ResNet blocks share their ReLU). Each call
    already has its own ``nn_module_stack`` key (``relu``, ``relu@1``...): it
    becomes the node's ``source_fn_stack``, which the partitioning reads first.
    Module names are untouched. Returns ``model``, changed in place.
    """

    def innermost(node: fx.Node) -> tuple[str, str, object] | None:
        stack = node.meta.get("nn_module_stack") if node.op == "call_function" else None
        if not stack or node.meta.get("source_fn_stack") is not None:
            return None
        key, (fqn, cls) = list(stack.items())[-1]
        return key, fqn, cls

    keys: dict[str, set[str]] = {}
    for node in model.graph.nodes:
        if (found := innermost(node)) is not None:
            keys.setdefault(found[1], set()).add(found[0])
    for node in model.graph.nodes:
        found = innermost(node)
        if found is None or len(keys[found[1]]) < 2:
            continue
        cls = pydoc.locate(found[2]) if isinstance(found[2], str) else found[2]
        if isinstance(cls, type):
            node.meta["source_fn_stack"] = [(found[0], cls)]
    return model


def torch_layer_sources(model: fx.GraphModule) -> fx.GraphModule:
    """Give the aten Linear/Conv node of a torch layer's subclass (a padding ``Conv2d`` whose forward pads,
    then calls ``F.conv2d``) the source partition of the torch layer it is.

    torchao's ``X86InductorQuantizer`` finds convs and Linears by the exact class of the module that made
    them, so it leaves a subclass's in float: 52 of MobileNetV2's 53 layers where its convs are such a
    subclass (the XNNPACK quantizer, which matches aten ops, quantizes them). Returns ``model``, changed
    in place; nodes that carry a source already are left as they are.
    """
    for node in exported_sites(model):
        stack = node.meta.get("nn_module_stack")
        if not stack or node.meta.get("source_fn_stack") is not None:
            continue
        key, (_fqn, cls) = list(stack.items())[-1]
        cls = pydoc.locate(cls) if isinstance(cls, str) else cls
        base = _MODULE_TYPES[ATEN_KINDS[node.target]]
        if isinstance(cls, type) and issubclass(cls, base) and cls is not base:
            node.meta["source_fn_stack"] = [(key, base)]
    return model


def exported_sites(model: nn.Module) -> list[fx.Node]:
    """The aten Linear/Conv nodes of an exported graph (empty for anything else)."""
    if not isinstance(model, fx.GraphModule):
        return []
    return [n for n in model.graph.nodes if n.op == "call_function" and n.target in ATEN_KINDS]


def fixed_input_shapes(model: fx.GraphModule) -> list[tuple[int | None, ...] | None]:
    """Each positional input's shape as ``model`` was exported for it: a size where the export fixed the
    dimension, ``None`` where it is dynamic; ``None`` for an input that is no tensor (or not known)."""
    shapes: list[tuple[int | None, ...] | None] = []
    for node in model.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            shapes.append(tuple(size if isinstance(size, int) else None for size in value.shape))
        else:
            shapes.append(None)
    return shapes


def misfit_input(model: fx.GraphModule, inputs: Sequence[object]) -> str:
    """What of ``inputs`` an exported ``model`` cannot run, said in one phrase (its guard would fail
    with a torch traceback): ``"input 0 shaped (8, 3, 32, 32), exported for (1, 3, 32, 32)"``; ``""``:
    none."""
    for position, (fixed, value) in enumerate(zip(fixed_input_shapes(model), inputs, strict=False)):
        if fixed is None or not isinstance(value, torch.Tensor):
            continue
        if len(fixed) != value.dim() or any(size not in (None, got) for size, got in zip(fixed, value.shape)):
            said = ", ".join("any" if size is None else str(size) for size in fixed)
            return f"input {position} shaped {tuple(value.shape)}, exported for ({said})"
    return ""


class _Tap(nn.Module):
    def __init__(self, observe: Callable[[torch.Tensor], object]) -> None:
        super().__init__()
        self.observe = observe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            self.observe(x)
        return x


_TAP_NAMES = itertools.count()


def tap_nodes(model: fx.GraphModule, nodes: Sequence[fx.Node], observe: Callable[[torch.Tensor], object]) -> Detach:
    """Calls ``observe`` with the value of each of ``nodes`` on every run, until the returned detach.

    A tap is a pass-through module inserted after the node; detach erases it,
    so the graph's code is what it was.
    """
    return tap_each(model, [(node, observe) for node in nodes])


def tap_each(model: fx.GraphModule, taps: Sequence[tuple[fx.Node, Callable[[torch.Tensor], object]]]) -> Detach:
    """:func:`tap_nodes` with an observer of its own for each node, all inserted with one recompile."""
    graph = model.graph
    inserted: list[tuple[fx.Node, str]] = []
    for node, observe in taps:
        name = f"_qinsight_tap_{next(_TAP_NAMES)}"
        model.add_submodule(name, _Tap(observe))
        with graph.inserting_after(node):
            inserted.append((graph.call_module(name, (node,)), name))
    model.recompile()

    def detach() -> None:
        for tap, name in inserted:
            graph.erase_node(tap)
            model.delete_submodule(name)
        model.recompile()

    return detach


class ExportedView(ModelViewBase):
    """The :class:`~qinsight.plugin.ModelView` of an exported GraphModule."""

    _frontend = "export"
    _model: fx.GraphModule

    def __init__(self, model: fx.GraphModule, qconfig_mapping: QConfigMapping | None) -> None:
        self._model = model
        self._nodes: dict[str, fx.Node] = {}
        self._weights: dict[str, fx.Node | None] = {}
        sites = []
        for node, (fqn, occurrence) in _layer_calls(model).items():
            weight, observer = _weight_source(node, model)
            self._nodes[fqn] = node
            self._weights[fqn] = weight
            sites.append(attrs.evolve(self._site(fqn, node, observer, qconfig_mapping), occurrence=occurrence))
        self._sites = tuple(sites)
        self._ops = self._op_sites()

    def _op_sites(self) -> tuple[OpSite, ...]:
        """The ops around the layers, named as the FX frontend names them; ``quantized`` as PT2E would."""
        calls = _op_calls(self._model)
        self._nodes.update({name: node for node, (name, _occurrence) in calls.items()})
        quantized = _quantized_by_pt2e(self._model)
        ops = []
        for node, (name, occurrence) in calls.items():
            rank = _rank(_operands(node)[0] if _operands(node) else node) or 0
            ops.append(
                OpSite(
                    fqn=name,
                    occurrence=occurrence,
                    kind=OP_NAME_KINDS[ATEN_OPS[node.target]],
                    module_type=f"aten.{ATEN_OPS[node.target]}",
                    quantized=quantized is None or node in quantized,
                    input_rank=rank,
                )
            )
        return tuple(ops)

    def _site(self, fqn: str, node: fx.Node, observer: nn.Module | None, mapping: QConfigMapping | None) -> OpSite:
        kind = ATEN_KINDS[node.target]
        scheme = None
        if observer is not None:  # prepare_pt2e: the quantizer's weight observer decides
            per_channel = getattr(observer, "qscheme", None) in _PER_CHANNEL
            scheme = WeightScheme.PER_CHANNEL if per_channel else WeightScheme.PER_TENSOR
        elif mapping is not None:
            scheme = weight_scheme(resolve_qconfig(mapping, fqn.partition("#")[0], _MODULE_TYPES[kind]))
        groups = (
            node.args[_GROUPS_ARG] if kind.is_conv and len(node.args) > _GROUPS_ARG else node.kwargs.get("groups", 1)
        )
        return OpSite(
            input_rank=_rank(node.args[0]) if node.args else None,
            fqn=fqn,
            kind=kind,
            module_type=f"aten.{getattr(node.target, '__name__', str(node.target))}",
            groups=int(groups) if isinstance(groups, int) else 1,
            weight_scheme=scheme,
        )

    def weight(self, fqn: str) -> torch.Tensor:
        self.site(fqn)
        node = self._weights[fqn]
        if node is None:
            raise FrontendError(f"the weight of {fqn} is computed in the graph, not a parameter")
        value = fetch_attr(self._model, str(node.target))
        if not isinstance(value, torch.Tensor):
            raise FrontendError(f"{node.target} is not a tensor")
        return value.detach()

    def attach(self, fqn: str, side: Side, observe: Callable[[torch.Tensor], object]) -> Detach:
        self.site(fqn)
        value = _side_value(self._nodes[fqn], side)
        return tap_nodes(self._model, [value] if isinstance(value, fx.Node) else [], observe)


def _rank(value: object) -> int | None:
    """The rank of a node's value, from the fake tensor torch.export records."""
    meta = value.meta.get("val") if isinstance(value, fx.Node) else None
    return meta.dim() if isinstance(meta, torch.Tensor) else None


def _operands(node: fx.Node) -> list[object]:
    """The tensor operands of an op node: cat's come as one list."""
    args: list[object] = list(node.args)
    if node.target is aten.cat.default and args and isinstance(args[0], (list, tuple)):
        return list(args[0])
    return args


def _side_value(node: fx.Node, side: Side) -> object:
    if side is Side.POST:
        return node
    operands = _operands(node)
    index = 0 if side is Side.PRE else 1
    return operands[index] if len(operands) > index else None


def _quantized_by_pt2e(model: fx.GraphModule) -> set[fx.Node] | None:
    """The op nodes PT2E quantizes: in a ``prepare_pt2e`` graph those next to an observer; else those
    torchao's default X86InductorQuantizer annotates (``None`` without torchao: not known)."""
    if any(_is_observer(node, model) for node in model.graph.nodes):
        return {
            node
            for node in model.graph.nodes
            if any(_is_observer(n, model) for n in (*node.all_input_nodes, *node.users))
        }
    try:
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    except ImportError:
        return None
    quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    unmarked = [node for node in model.graph.nodes if "source_fn_stack" not in node.meta]
    quantizer.annotate(separate_shared_calls(model))  # on the graph itself, then cleaned: no copy of the weights
    annotated = {node for node in model.graph.nodes if node.meta.pop("quantization_annotation", None) is not None}
    for node in unmarked:  # nothing of ours left on the user's graph
        node.meta.pop("source_fn_stack", None)
    return annotated


def exported_view(model: object, qconfig_mapping: QConfigMapping | None = None) -> ExportedView:
    """The view of a ``torch.export`` ExportedProgram (its ``.module()`` is used) or of an exported GraphModule."""
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()
    if not isinstance(model, fx.GraphModule) or not exported_sites(model):
        raise FrontendError(f"{type(model).__name__} is not an exported graph with Linear/Conv ops")
    return ExportedView(model, qconfig_mapping)
