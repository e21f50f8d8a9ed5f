"""The Linear/Conv layers of a quantized model, one interface for both quantization flows.

The comparisons need three things of each quantized layer: the weight it
computes with (dequantized), its output on every batch, and its output when it
is fed the *float* model's input instead (the local error). Where those live
depends on the flow:

- ``convert_fx`` (and eager) models keep modules named like the float ones:
  a quantized module's weight is packed, its input arrives quantized with the
  qparams to reuse, its output is a hook away.
- ``convert_pt2e`` graphs keep aten ops between quantize/dequantize nodes:
  ``dq(q(x)) -> conv2d(dq(w_int8), b) -> relu -> q -> dq``. A layer is the aten
  op, named by its ``nn_module_stack``; its output is the dequantize that ends
  its chain (through relu/hardtanh: PT2E quantizes after them); the local run replays
  that small stretch of graph, from the input's quantize to the output's
  dequantize, on the float input. BatchNorm was folded into the conv's weight
  and bias by ``prepare_pt2e``, as by ``convert_fx``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
import torch.ao.quantization.quantize_fx  # noqa: F401  registers the quantized_decomposed ops read below
from torch import fx, nn
from torch.ao.nn.intrinsic.modules.fused import _FusedModule

from qinsight.compare import torchao_weights
from qinsight.compare.torchao_weights import is_torchao_weight
from qinsight.core.errors import FrontendError
from qinsight.core.sites import OpKind
from qinsight.frontends import (
    ATEN_KINDS,
    ModelStructure,
    QuantizableModule,
    call_target,
    exported_sites,
    fetch_attr,
    module_name_of,
    quantizable_modules,
    tap_nodes,
    weight_argument,
)
from qinsight.plugin import Detach

OnOutput = Callable[[torch.Tensor], None]


class QuantizedLayer(Protocol):
    """One Linear/Conv of a quantized model, matched to the float model's module ``fqn``."""

    @property
    def fqn(self) -> str: ...

    @property
    def kind(self) -> OpKind: ...

    @property
    def quantized_type(self) -> str:
        """What computes it: a module's qualified class name, or an aten op."""
        ...

    @property
    def quantized(self) -> bool:
        """False where the quantized model left this layer in float."""
        ...

    def weight(self) -> torch.Tensor:
        """The weight it computes with, dequantized."""
        ...

    def attach(self, on_output: OnOutput) -> Detach:
        """Calls ``on_output`` with its output (possibly quantized: :func:`dequantize` it) on every run."""
        ...

    def absorbs(self, module: nn.Module) -> bool:
        """Whether its output already includes float ``module`` (a BatchNorm or activation after it)."""
        ...

    def local(self, float_input: torch.Tensor) -> torch.Tensor:
        """Its output (possibly quantized: :func:`dequantize` it) for the float model's input,
        quantized as its own input is.

        Valid after a run of the quantized model (where the input's qparams are
        read from the data, they are those of the last run).
        """
        ...


def dequantize(value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"expected a tensor output, got {type(value).__name__}")
    return value.dequantize() if value.is_quantized else value


def dequantized_weight(module: nn.Module) -> torch.Tensor | None:
    """The weight a quantized (or reference, dynamic, fused, torchao ``quantize_``d, float) module
    computes with, as float."""
    weight = getattr(module, "weight", None)
    if is_torchao_weight(weight):
        return torchao_weights.dequantized(weight)
    if callable(weight) and not isinstance(weight, torch.Tensor):  # quantized modules: weight() is packed
        value: torch.Tensor = weight()
        return value.dequantize() if value.is_quantized else value
    get_weight = getattr(module, "get_weight", None)  # reference modules: quantize-dequantize
    if callable(get_weight):
        result: torch.Tensor = get_weight()
        return result
    if isinstance(weight, torch.Tensor):
        return weight
    if isinstance(module, _FusedModule):
        return dequantized_weight(module[0])
    return None


def _qualified_name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class Arrival(NamedTuple):
    """How a quantized model's layer or op input arrived: its per-tensor qparams (None: not
    quantized) and whether channels-last; what a local run quantizes the float input like."""

    qparams: tuple[float, int, torch.dtype] | None
    channels_last: bool

    @classmethod
    def of(cls, value: torch.Tensor) -> Arrival:
        per_tensor = value.is_quantized and value.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric)
        qparams = (value.q_scale(), value.q_zero_point(), value.dtype) if per_tensor else None
        return cls(
            qparams,
            value.dim() == 4 and not value.is_contiguous() and value.is_contiguous(memory_format=torch.channels_last),
        )

    def like(self, operand: torch.Tensor) -> torch.Tensor:
        """The float ``operand`` as the op's own arrived: quantized with its qparams, in its layout
        (so the local output is laid out as the quantized model's, and compared without a copy)."""
        if self.qparams is not None:
            operand = torch.quantize_per_tensor(operand.float(), *self.qparams)
        # after quantizing: a copy of 1 byte per value instead of 4
        return operand.contiguous(memory_format=torch.channels_last) if self.channels_last else operand


class ModuleLayer:
    """A layer of a ``convert_fx`` (or eager-converted) model: a module named like the float one."""

    def __init__(self, fqn: str, kind: OpKind, module: nn.Module) -> None:
        self.fqn, self.kind, self.module = fqn, kind, module
        weight = getattr(module, "weight", None)
        if is_torchao_weight(weight):  # quantize_: a plain module whose weight is a quantized tensor
            self.quantized_type = f"{_qualified_name(module)}: {torchao_weights.format_of(weight)}"
            self.quantized = True
        else:
            self.quantized_type = _qualified_name(module)
            # torch.ao.nn.quantized, .quantized.dynamic, .quantized.reference, .intrinsic.quantized
            self.quantized = ".quantized" in type(module).__module__
        self._arrived = Arrival(None, channels_last=False)

    def weight(self) -> torch.Tensor:
        weight = dequantized_weight(self.module)
        if weight is None:
            raise FrontendError(f"{self.fqn} ({self.quantized_type}) has no weight")
        return weight

    def _keep_input(self, _module: nn.Module, args: tuple[Any, ...]) -> None:
        if isinstance(args[0], torch.Tensor):
            self._arrived = Arrival.of(args[0])  # its qparams, not the tensor: the batch's activations are freed

    def attach(self, on_output: OnOutput) -> Detach:
        removers = [
            self.module.register_forward_pre_hook(self._keep_input).remove,
            self.module.register_forward_hook(lambda _m, _a, out: on_output(out)).remove,
        ]

        def detach() -> None:
            for remove in removers:
                remove()

        return detach

    def absorbs(self, module: nn.Module) -> bool:
        # convert_fx folds BatchNorm into the conv/linear and fuses ReLU (ConvReLU2d,
        # LinearReLU), not ReLU6 or Hardtanh, which stay modules of their own.
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return True
        return type(module) is nn.ReLU and "ReLU" in type(self.module).__name__

    def local(self, float_input: torch.Tensor) -> torch.Tensor:
        float_input = self._arrived.like(float_input)
        # forward, not __call__: the hooks attach() put on the module must not see this run
        # (they would dequantize its output a second time and overwrite the kept input).
        output: torch.Tensor = self.module.forward(float_input)
        return output


_decomposed = torch.ops.quantized_decomposed
QDQ_TARGETS = {
    _decomposed.quantize_per_tensor.default,
    _decomposed.quantize_per_tensor.tensor,
    _decomposed.quantize_per_tensor.tensor2,
    _decomposed.dequantize_per_tensor.default,
    _decomposed.dequantize_per_tensor.tensor,
    _decomposed.dequantize_per_tensor.tensor2,
}
QUANTIZE_TARGETS = {t for t in QDQ_TARGETS if "dequantize" not in str(t)}
# Activations a quantizer puts inside a conv/linear's quantized output (BatchNorm is folded).
_RELU = {torch.ops.aten.relu.default, torch.ops.aten.relu_.default}
_HARDTANH = {torch.ops.aten.hardtanh.default, torch.ops.aten.hardtanh_.default}
TAIL_TARGETS = _RELU | _HARDTANH


def single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].op == "call_function" else None


def walk_tail(op: fx.Node) -> list[fx.Node]:
    """The relu/hardtanh nodes PT2E quantizes after ``op``, each the only user of the one before."""
    walked, end = [], op
    while (user := single_user(end)) is not None and user.target in TAIL_TARGETS:
        walked.append(user)
        end = user
    return walked


class GraphProgram:
    """The stretch of a graph from ``starts`` to ``output``, replayed on other values of the starts.

    The local runs: the nodes in order and the constants they read (int8 weights,
    scales: evaluated once). Raises :class:`FrontendError` where the output depends on
    anything else (a placeholder, another input).
    """

    def __init__(
        self, model: fx.GraphModule, starts: list[fx.Node], output: fx.Node, constant: set[fx.Node], name: str
    ) -> None:
        self.model, self.output = model, output
        self.steps: list[fx.Node] = []
        self.constants: dict[fx.Node, object] = {}
        seen: set[fx.Node] = set(starts)

        def visit(node: fx.Node) -> None:
            if node in seen:
                return
            seen.add(node)
            if node in constant:
                self.constants[node] = evaluate_constant(model, node)
                return
            if node.op not in ("call_function", "call_method", "call_module"):
                raise FrontendError(f"{name}: its output depends on {node.name}, not only on its inputs")
            for arg in node.all_input_nodes:
                visit(arg)
            self.steps.append(node)

        visit(output)

    def run(self, starts: dict[fx.Node, object]) -> torch.Tensor:
        env: dict[fx.Node, Any] = {**self.constants, **starts}
        for node in self.steps:
            args, kwargs = fx.map_arg((node.args, node.kwargs), lambda n: env[n])
            env[node] = _call(self.model, node, args, kwargs)
        output: torch.Tensor = env[self.output]
        return output


def _call(model: fx.GraphModule, node: fx.Node, args: Any, kwargs: Any) -> Any:
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    if node.op == "call_module":  # forward: the hooks of a layer being compared must not see the replay
        return model.get_submodule(str(node.target)).forward(*args, **kwargs)
    return call_target(node, args, kwargs)


class GraphLayer:
    """A layer of a ``convert_pt2e`` graph: an aten linear/conv node between quantize/dequantize nodes."""

    def __init__(self, model: fx.GraphModule, op: fx.Node, fqn: str, constant: set[fx.Node]) -> None:
        self.model, self.op, self.fqn = model, op, fqn
        self._constant = constant
        self.kind = ATEN_KINDS[op.target]
        self.quantized_type = str(op.target)
        tail = walk_tail(op)
        self._activations = {node.target for node in tail}
        self.output = self._dequantized(tail[-1] if tail else op)
        self.input_node = self._activation_input()  # the float value the layer's input quantize reads
        self._program = GraphProgram(model, [self.input_node], self.output, constant, fqn)
        self._weight = weight_argument(op)
        self.quantized = isinstance(self._weight, fx.Node) and "dequantize" in str(self._weight.target)

    @staticmethod
    def _dequantized(end: fx.Node) -> fx.Node:
        """The dequantize after ``end``'s quantize, where its value leaves the quantized domain, else ``end``."""
        quantize = single_user(end)
        if quantize is not None and quantize.target in QUANTIZE_TARGETS:
            dequantize_node = single_user(quantize)
            if dequantize_node is not None and dequantize_node.target in QDQ_TARGETS:
                return dequantize_node
        return end

    def _activation_input(self) -> fx.Node:
        node = self.op.args[0]
        while isinstance(node, fx.Node) and node.target in QDQ_TARGETS:
            node = node.args[0]
        if not isinstance(node, fx.Node):
            raise FrontendError(f"{self.fqn}: no activation input in the graph")
        return node

    def weight(self) -> torch.Tensor:
        if not isinstance(self._weight, fx.Node) or self._weight not in self._program.constants:
            raise FrontendError(f"{self.fqn}: the weight is not a constant of the graph")
        value = self._program.constants[self._weight]
        if not isinstance(value, torch.Tensor):
            raise FrontendError(
                f"{self.fqn}: the weight node {self._weight.name!r} holds {type(value).__name__}, not a tensor"
            )
        return value

    def attach(self, on_output: OnOutput) -> Detach:
        return tap_nodes(self.model, [self.output], on_output)

    def absorbs(self, module: nn.Module) -> bool:
        # prepare_pt2e folded BatchNorm; the activations are whatever the chain walked through.
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return True
        wanted = _RELU if type(module) is nn.ReLU else _HARDTANH if isinstance(module, nn.Hardtanh) else set()
        return bool(wanted & self._activations)

    def local(self, float_input: torch.Tensor) -> torch.Tensor:
        return self._program.run({self.input_node: float_input})


# convert_fx's functional Linear/Conv ops (a module's F.conv2d that FX traced into), ReLU fused or not
_FX_CALL_KINDS = {
    "linear": OpKind.LINEAR,
    "conv1d": OpKind.CONV1D,
    "conv2d": OpKind.CONV2D,
    "conv3d": OpKind.CONV3D,
}


def _fx_call_kind(node: fx.Node) -> OpKind | None:
    if node.op != "call_function" or not str(node.target).startswith("quantized."):
        return None
    return _FX_CALL_KINDS.get(str(node.target).removeprefix("quantized.").removesuffix("_relu"))


class FxCallLayer:
    """A layer of a ``convert_fx`` graph that is a quantized op, not a module: the functional conv or
    linear a module's own forward made on its weight (a padding ``Conv2d`` subclass, traced into)."""

    def __init__(self, model: fx.GraphModule, op: fx.Node, fqn: str, kind: OpKind, constant: set[fx.Node]) -> None:
        self.model, self.op, self.fqn, self.kind = model, op, fqn, kind
        self.quantized_type, self.quantized = str(op.target), True
        arrival = op.args[0]
        if not isinstance(arrival, fx.Node):
            raise FrontendError(f"{fqn}: no activation input in the graph")
        quantize = arrival.op == "call_function" and arrival.target is torch.quantize_per_tensor
        self._start: fx.Node = arrival.args[0] if quantize else arrival  # type: ignore[assignment]
        self._arrived = Arrival(None, channels_last=False)  # where the input arrives quantized already
        self._program = GraphProgram(model, [self._start], op, constant, fqn)

    def weight(self) -> torch.Tensor:
        packed: Any = self._program.constants.get(self.op.args[1])  # type: ignore[arg-type]
        unpacked = torch.ops.quantized.linear_unpack(packed) if self.kind is OpKind.LINEAR else packed.unpack()
        weight: torch.Tensor = unpacked[0]
        return weight.dequantize() if weight.is_quantized else weight

    def attach(self, on_output: OnOutput) -> Detach:
        def arrive(value: torch.Tensor) -> None:
            self._arrived = Arrival.of(value)

        stops = [tap_nodes(self.model, [self.op], on_output), tap_nodes(self.model, [self._start], arrive)]

        def detach() -> None:
            for stop in stops:
                stop()

        return detach

    def absorbs(self, module: nn.Module) -> bool:
        return type(module) is nn.ReLU and str(self.op.target).endswith("_relu")  # no BatchNorm: FX kept it apart

    def local(self, float_input: torch.Tensor) -> torch.Tensor:
        return self._program.run({self._start: self._arrived.like(float_input)})


def constant_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes that depend on no input: parameters, buffers and what is computed from them alone."""
    constant: set[fx.Node] = set()
    for node in graph.nodes:  # topological order: a node's inputs come before it
        if node.op == "get_attr" or (node.op == "call_function" and all(a in constant for a in node.all_input_nodes)):
            constant.add(node)
    return constant


def evaluate_constant(model: fx.GraphModule, node: fx.Node) -> object:
    """The value of a constant node (a get_attr, or ops on get_attrs such as a weight's dequantize)."""
    if node.op == "get_attr":
        return fetch_attr(model, str(node.target))
    value_of: Callable[[fx.Node], Any] = lambda n: evaluate_constant(model, n)  # noqa: E731
    args, kwargs = fx.map_arg((node.args, node.kwargs), value_of)
    return call_target(node, args, kwargs)


def quantized_layers(
    float_model: nn.Module, quantized_model: nn.Module, structure: ModelStructure | None = None
) -> dict[str, QuantizedLayer]:
    """The layers of ``quantized_model`` that match a Linear/Conv of ``float_model`` by name.

    A ``convert_pt2e`` graph is read as aten ops named by their module stack
    (a module called several times: its last call); anything else as modules.
    """
    float_layers = structure.modules if structure is not None else quantizable_modules(float_model)
    layers: dict[str, QuantizedLayer] = {}
    if isinstance(quantized_model, fx.GraphModule) and (ops := exported_sites(quantized_model)):
        constant = constant_nodes(quantized_model.graph)
        for op in ops:
            fqn = module_name_of(op)
            if fqn in float_layers:
                layers[fqn] = GraphLayer(quantized_model, op, fqn, constant)
        return layers
    for fqn, found in float_layers.items():
        try:
            module = quantized_model.get_submodule(fqn)
        except AttributeError:
            continue  # not in the quantized model (removed or renamed): nothing to compare
        if dequantized_weight(module) is not None:
            layers[fqn] = ModuleLayer(fqn, found.kind, module)
    if isinstance(quantized_model, fx.GraphModule):
        layers.update(_fx_call_layers(quantized_model, float_layers))
    return layers


def _fx_call_layers(model: fx.GraphModule, float_layers: dict[str, QuantizableModule]) -> dict[str, QuantizedLayer]:
    """The quantized functional layers of a ``convert_fx`` graph, by the module whose forward made them."""
    constant = constant_nodes(model.graph)
    found: dict[str, QuantizedLayer] = {}
    for node in model.graph.nodes:
        kind = _fx_call_kind(node)
        stack = list((node.meta.get("nn_module_stack") or {}).keys())
        if kind is not None and stack and str(stack[-1]) in float_layers and str(stack[-1]) not in found:
            found[str(stack[-1])] = FxCallLayer(model, node, str(stack[-1]), kind, constant)
    return found


__all__ = [
    "Arrival",
    "QDQ_TARGETS",
    "QUANTIZE_TARGETS",
    "GraphProgram",
    "constant_nodes",
    "evaluate_constant",
    "single_user",
    "walk_tail",
    "FxCallLayer",
    "GraphLayer",
    "ModuleLayer",
    "QuantizedLayer",
    "dequantize",
    "dequantized_weight",
    "quantized_layers",
]
