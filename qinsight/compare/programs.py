"""Running what a backend lowers: the program of a converted model, its size and its time.

A quantized model from ``convert_pt2e`` is a *reference*: it simulates int8 in
float. What runs on the device is the program a backend's
:class:`~qinsight.core.backend.Lowering` makes of it (XNNPACK through ExecuTorch,
x86 through inductor: :mod:`qinsight.backends`). Here is what every lowering
shares: a module copied for lowering, lowering's failures as one error, its
chatter kept quiet, the bytes a module holds, a converted model run as its
program (:class:`LoweredModule`), a program timed.
"""

from __future__ import annotations

import contextlib
import copy
import io
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
from torch import fx, nn

from qinsight.core.backend import Lowering, Program
from qinsight.core.comparison import ProgramCost
from qinsight.core.errors import FrontendError, MissingExtraError
from qinsight.frontends import fetch_attr


@contextlib.contextmanager
def quiet() -> Iterator[None]:
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


def package_version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


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
    (a program runs one shape), and every call timed. What a plan scores with ``lowered=True``: the
    program that ships, and what it costs (:meth:`cost`)."""

    def __init__(self, lowering: Lowering, module: nn.Module, what: str = "the quantized model") -> None:
        super().__init__()
        self._lowering, self._reference = lowering, [module]  # a list: not a submodule, whose modes it would set
        self._what = what
        self._programs: dict[tuple[object, ...], Program] = {}
        self._times: list[float] = []  # each call's milliseconds

    def forward(self, *inputs: Any) -> Any:
        shapes = tuple(
            tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__ for value in inputs
        )
        program = self._programs.get(shapes)
        if program is None:
            program = lowered(self._lowering, self._reference[0], inputs, self._what)
            self._programs[shapes] = program
            program(*inputs)  # warm, untimed: the first call allocates, compiles or loads
        output, milliseconds = timed(program, inputs)
        self._times.append(milliseconds)
        return output

    def cost(self) -> ProgramCost | None:
        """The median time of a call so far and the largest program's size; ``None``: never called."""
        if not self._times:
            return None
        size = max(program.size_bytes for program in self._programs.values())
        return ProgramCost(latency_ms=statistics.median(self._times), size_bytes=size)


def shipped(module: nn.Module, lowering: Lowering | None) -> nn.Module:
    """What the user runs of a converted ``module``: itself, or its program for ``lowering``."""
    return module if lowering is None else LoweredModule(lowering, module)


def timed(program: Callable[..., Any], inputs: tuple[Any, ...]) -> tuple[Any, float]:
    """``program(*inputs)`` and its wall time in milliseconds."""
    start = time.perf_counter()
    output = program(*inputs)
    return output, (time.perf_counter() - start) * 1000.0


__all__ = [
    "LoweredModule",
    "evaluated_copy",
    "held_bytes",
    "lowered",
    "package_version",
    "quiet",
    "shipped",
    "timed",
]
