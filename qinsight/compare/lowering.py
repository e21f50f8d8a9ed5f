"""Lowering a PT2E model for a backend, as the user ships it: the program that runs, its size.

A quantized model from ``convert_pt2e`` is a *reference*: it simulates int8 in
float. What runs on the device is the program lowered from it:

- ``xnnpack``: ``torch.export``, then ExecuTorch's ``to_edge_transform_and_lower``
  with the XNNPACK partitioner and ``to_executorch()``; run by
  ``executorch.runtime`` (the ``qinsight[executorch]`` extra). Its size is the
  ``.pte``'s bytes.
- ``x86``: ``torch.compile`` with inductor and freezing (the weights folded as
  constants, the quantized patterns fused into oneDNN int8 kernels). Its size is
  the bytes of the tensors the module computes with (its graph's constants: the
  int8 weights and their scales); the compiled program itself is code.

Each backend is one :class:`Lowering` in :data:`LOWERINGS`; a lowering works on any
module that ``torch.export`` can take (the float model too, for the comparison of
latency and size).
"""

from __future__ import annotations

import contextlib
import copy
import io
import time
import warnings
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import torch
from torch import fx, nn

from qinsight.core.errors import FrontendError, InvalidParameterError, MissingExtraError
from qinsight.frontends import fetch_attr

EXECUTORCH_HINT = "lowering to XNNPACK needs ExecuTorch: pip install 'qinsight[executorch]'"


class Program(Protocol):
    """A lowered program: called with a batch's positional tensors, it returns the model's outputs."""

    size_bytes: int

    def __call__(self, *inputs: torch.Tensor) -> Any: ...


class Lowering(Protocol):
    """How one backend turns a module into the program it runs."""

    backend: str

    def runtime(self) -> str:
        """What runs the program, with its version: what a comparison names."""
        ...

    def lower(self, module: nn.Module, example: tuple[Any, ...]) -> Program:
        """``module`` (a copy of it: the module is not changed) lowered for inputs shaped like ``example``."""
        ...


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Lowering's own chatter (torch.export's and ExecuTorch's warnings and logging to stderr) kept
    off the user's terminal: a failure is raised, and what succeeded needs no commentary."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def evaluated_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` in eval mode, set flag by flag: ``eval()`` raises on an exported model."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's pytree deprecations, said on copying an exported model
        copied = copy.deepcopy(module)
    for submodule in copied.modules():
        submodule.training = False
    return copied


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


class _ExecuTorchProgram:
    def __init__(self, buffer: bytes) -> None:
        from executorch.runtime import Runtime

        self._buffer = buffer  # the loaded program reads from it
        self._method = Runtime.get().load_program(buffer).load_method("forward")
        self.size_bytes = len(buffer)

    def __call__(self, *inputs: torch.Tensor) -> Any:
        try:
            outputs = self._method.execute([tensor.contiguous() for tensor in inputs])
        except RuntimeError as exc:  # the runtime logged why to stderr; its exception says only a code
            raise FrontendError(f"the ExecuTorch runtime failed to run the program: {exc}") from exc
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class XnnpackLowering:
    """XNNPACK through ExecuTorch: every pattern the partitioner takes runs in the delegate, the rest
    in ExecuTorch's portable kernels."""

    backend = "xnnpack"

    def runtime(self) -> str:
        return f"ExecuTorch {_version('executorch')} runtime, XNNPACK delegate"

    def lower(self, module: nn.Module, example: tuple[Any, ...]) -> Program:
        try:
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
            from executorch.exir import to_edge_transform_and_lower
        except ImportError as exc:
            raise MissingExtraError(f"{EXECUTORCH_HINT} ({exc})") from exc
        with _quiet():
            exported = torch.export.export(evaluated_copy(module), example)
            edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
            return _ExecuTorchProgram(edge.to_executorch().buffer)


def held_bytes(module: nn.Module) -> int:
    """The bytes of the tensors ``module`` computes with, each storage counted once: a graph's constants
    (``convert_pt2e`` keeps the float parameters beside the int8 weights its graph reads), else the
    parameters and buffers."""
    if isinstance(module, fx.GraphModule):
        values = [fetch_attr(module, str(node.target)) for node in module.graph.nodes if node.op == "get_attr"]
        tensors = [value for value in values if isinstance(value, torch.Tensor)]
    else:
        tensors = [*module.parameters(), *module.buffers()]
    storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes() for tensor in tensors}
    return sum(storages.values())


class _CompiledProgram:
    def __init__(self, compiled: Callable[..., Any], size_bytes: int) -> None:
        self._compiled, self.size_bytes = compiled, size_bytes

    def __call__(self, *inputs: torch.Tensor) -> Any:
        from torch._inductor import config

        with torch.no_grad(), config.patch(freezing=True):
            return self._compiled(*inputs)


class InductorLowering:
    """x86: ``torch.compile`` with inductor and freezing, as torchao's X86InductorQuantizer is meant
    to be deployed; compiled at the first call, which :meth:`lower` makes."""

    backend = "x86"

    def runtime(self) -> str:
        return f"torch {torch.__version__} torch.compile (inductor, freezing)"

    def lower(self, module: nn.Module, example: tuple[Any, ...]) -> Program:
        copied = evaluated_copy(module)
        program = _CompiledProgram(torch.compile(copied, dynamic=False), held_bytes(copied))
        with _quiet():
            program(*example)
        return program


LOWERINGS: dict[str, Lowering] = {lowering.backend: lowering for lowering in (XnnpackLowering(), InductorLowering())}


def lowering_for(owner: str, backend: str) -> Lowering:
    """The lowering of ``backend``; one :class:`InvalidParameterError` naming the others if none."""
    if backend not in LOWERINGS:
        raise InvalidParameterError(owner, "backend", backend, "one of " + ", ".join(LOWERINGS))
    return LOWERINGS[backend]


def lowered(lowering: Lowering, module: nn.Module, example: tuple[Any, ...], what: str) -> Program:
    """:meth:`Lowering.lower`, its failures (export, a partitioner, a compiler: torch's errors have no
    common base) said as one :class:`FrontendError` naming ``what`` was lowered."""
    try:
        return lowering.lower(module, example)
    except MissingExtraError:
        raise
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        why = f"{type(exc).__name__}: {message}"
        raise FrontendError(f"{what} cannot be lowered for {lowering.backend}: {why}") from exc


class LoweredModule(nn.Module):
    """``module``'s program for ``lowering``, as a module: lowered at the first batch of each shape
    (a program runs one shape). What a plan scores with ``lowered=True``: the program that ships."""

    def __init__(self, lowering: Lowering, module: nn.Module) -> None:
        super().__init__()
        self._lowering, self._reference = lowering, [module]  # a list: not a submodule, whose modes it would set
        self._programs: dict[tuple[object, ...], Program] = {}

    def forward(self, *inputs: Any) -> Any:
        shapes = tuple(
            tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__ for value in inputs
        )
        program = self._programs.get(shapes)
        if program is None:
            program = lowered(self._lowering, self._reference[0], inputs, "the quantized model")
            self._programs[shapes] = program
        return program(*inputs)


def shipped(module: nn.Module, lowering: Lowering | None) -> nn.Module:
    """What the user runs of a converted ``module``: itself, or its program for ``lowering``."""
    return module if lowering is None else LoweredModule(lowering, module)


def timed(program: Callable[..., Any], inputs: tuple[Any, ...]) -> tuple[Any, float]:
    """``program(*inputs)`` and its wall time in milliseconds."""
    start = time.perf_counter()
    output = program(*inputs)
    return output, (time.perf_counter() - start) * 1000.0


__all__ = [
    "EXECUTORCH_HINT",
    "InductorLowering",
    "LOWERINGS",
    "LoweredModule",
    "Lowering",
    "Program",
    "XnnpackLowering",
    "evaluated_copy",
    "held_bytes",
    "lowered",
    "lowering_for",
    "shipped",
    "timed",
]
