"""Functional calls as op sites: ``x + y``, ``q @ k``, ``torch.softmax`` inside a module's forward.

These have no module to hook. A :class:`CallTap` (a ``TorchFunctionMode``,
active only while the model runs) sees each call, names it as FX's
``QConfigMapping`` does (the module whose forward makes it, the call as FX
records it, and its index among that module's calls of it), and hands its
operands and output to the observers attached to that name. Calls inside
torch's own modules (the ``F.layer_norm`` inside ``nn.LayerNorm``) are not
sites: FX does not trace into those, and the module is a site of its own.

At run time ``x + y`` and ``x.add(y)`` are the same call (``Tensor.add``), so
both are named ``operator.add``, as FX records the first; the method form is rare.
"""

from __future__ import annotations

import contextlib
import operator
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from qinsight.core.sites import OpCall, OpKind, Side
from qinsight.plugin.detector import Detach

# What the tap sees -> (the call as FX records it, the op kind).
CALL_TARGETS: dict[Callable[..., Any], tuple[str, OpKind]] = {
    torch.Tensor.add: ("operator.add", OpKind.ADD),
    torch.Tensor.add_: ("operator.add", OpKind.ADD),
    torch.add: ("torch.add", OpKind.ADD),
    torch.Tensor.mul: ("operator.mul", OpKind.MUL),
    torch.Tensor.mul_: ("operator.mul", OpKind.MUL),
    torch.mul: ("torch.mul", OpKind.MUL),
    torch.cat: ("torch.cat", OpKind.CAT),
    torch.Tensor.matmul: ("operator.matmul", OpKind.MATMUL),
    torch.matmul: ("torch.matmul", OpKind.MATMUL),
    torch.bmm: ("torch.bmm", OpKind.MATMUL),
    torch.Tensor.bmm: ("bmm", OpKind.MATMUL),
    F.softmax: ("torch.nn.functional.softmax", OpKind.SOFTMAX),
    torch.softmax: ("torch.softmax", OpKind.SOFTMAX),
    torch.Tensor.softmax: ("softmax", OpKind.SOFTMAX),
    F.layer_norm: ("torch.nn.functional.layer_norm", OpKind.LAYER_NORM),
    F.group_norm: ("torch.nn.functional.group_norm", OpKind.GROUP_NORM),
    F.hardtanh: ("torch.nn.functional.hardtanh", OpKind.HARDTANH),
    F.relu6: ("torch.nn.functional.relu6", OpKind.HARDTANH),
    F.gelu: ("torch.nn.functional.gelu", OpKind.GELU),
    F.silu: ("torch.nn.functional.silu", OpKind.SILU),
    torch.sigmoid: ("torch.sigmoid", OpKind.SIGMOID),
    torch.Tensor.sigmoid: ("sigmoid", OpKind.SIGMOID),
    F.avg_pool2d: ("torch.nn.functional.avg_pool2d", OpKind.POOL),
    F.max_pool2d: ("torch.nn.functional.max_pool2d", OpKind.POOL),
    F.adaptive_avg_pool2d: ("torch.nn.functional.adaptive_avg_pool2d", OpKind.POOL),
}

# A Linear's or a convolution's functional call: a layer site where a module's own forward makes it on its
# weight (a padding Conv2d subclass calling F.conv2d: FX traces into it), read at the call itself.
LAYER_TARGETS: dict[Callable[..., Any], tuple[str, OpKind]] = {
    F.linear: ("torch.nn.functional.linear", OpKind.LINEAR),
    F.conv1d: ("torch.nn.functional.conv1d", OpKind.CONV1D),
    F.conv2d: ("torch.nn.functional.conv2d", OpKind.CONV2D),
    F.conv3d: ("torch.nn.functional.conv3d", OpKind.CONV3D),
}
CALL_TARGETS.update(LAYER_TARGETS)

Observe = Callable[[torch.Tensor], object]
WatchCall = Callable[[tuple[torch.Tensor, ...], torch.Tensor], object]


def is_leaf(module: nn.Module) -> bool:
    """FX's rule: torch's own modules are called, not traced into (Sequential and ModuleList excepted)."""
    return module.__module__.startswith(("torch.nn", "torch.ao.nn")) and not isinstance(
        module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    )


def _operands(kind: OpKind, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The tensor operands: cat's come as one sequence."""
    if kind is OpKind.CAT and args and isinstance(args[0], (list, tuple)):
        return tuple(args[0])
    return args


class _Paused:
    """Observers run inside the forward: their own torch calls are not the model's and must not be counted."""

    depth = 0

    def __enter__(self) -> None:
        _Paused.depth += 1

    def __exit__(self, *_exc: object) -> None:
        _Paused.depth -= 1


def hidden_calls() -> contextlib.AbstractContextManager[None]:
    """A context in which the torch calls made are not the model's: no :class:`CallTap` counts them."""
    return _Paused()


def unseen(observe: Observe) -> Observe:
    """``observe`` (an observer: plain tensor arithmetic), with the torch calls it makes hidden from every
    :class:`CallTap`. ``__torch_function__`` handling is off while it runs: a tap's mode would be entered
    and left for each of its calls, which cost about as much as the measuring itself on small activations
    (5-6 ms a batch on the Llama-shaped stack at width 512, 123 observed tensors)."""

    def hidden(tensor: torch.Tensor) -> object:
        with _Paused(), torch._C.DisableTorchFunction():
            return observe(tensor)

    return hidden


class _Mode(TorchFunctionMode):
    def __init__(self, tap: CallTap) -> None:
        super().__init__()
        self.tap = tap

    def __torch_function__(
        self, func: Callable[..., Any], types: object, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        found = CALL_TARGETS.get(func)
        if found is None or _Paused.depth or self.tap.in_leaf:
            return func(*args, **kwargs)
        return self.tap.call(found, func, args, kwargs)


class CallTap:
    """Sees the functional calls of one model's forward, each named as an :class:`OpCall`.

    Installed with hooks on every module (to know whose forward runs) and a
    mode entered as the root's forward starts and left as it ends, also when
    it raises. ``seen`` holds every call met on floating operands, with its kind and the rank of
    its first operand, for site discovery.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._owners: list[tuple[str, bool]] = []
        self._counts: Counter[tuple[str, str]] = Counter()
        # (owner, target, index) -> side -> observers: plain tuples, so a call costs no object per batch
        self._observers: dict[tuple[str, str, int], dict[Side, list[Observe]]] = {}
        self._watchers: dict[tuple[str, str, int], list[WatchCall]] = {}  # all operands and the output at once
        self._seen_keys: set[tuple[str, str, int]] = set()
        self.seen: dict[OpCall, tuple[OpKind, int]] = {}  # call -> (kind, rank of its first operand)
        self.weights: dict[OpCall, int] = {}  # a layer's call -> the id of the weight it was made with
        self._mode: _Mode | None = None
        self._removers: list[Callable[[], None]] = []

    @property
    def in_leaf(self) -> bool:
        return not self._owners or self._owners[-1][1]

    def install(self) -> None:
        for name, module in self.model.named_modules():
            leaf = bool(name) and is_leaf(module)
            self._removers.append(module.register_forward_pre_hook(self._entering(name, leaf)).remove)
            self._removers.append(module.register_forward_hook(self._leaving, always_call=True).remove)

    def remove(self) -> None:
        for remove in self._removers:
            remove()
        self._removers.clear()
        self._leave_mode()

    def __enter__(self) -> CallTap:
        self.install()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.remove()

    def observe(self, call: OpCall, side: Side, observe: Observe) -> Detach:
        observers = self._observers.setdefault((call.owner, call.target, call.index), {}).setdefault(side, [])
        observers.append(observe)
        return lambda: observers.remove(observe)

    def watch(self, call: OpCall, watch: WatchCall) -> Detach:
        """Calls ``watch`` with all of the call's tensor operands and its output (from inside the
        mode's handler, where the torch calls it makes are not seen)."""
        watchers = self._watchers.setdefault((call.owner, call.target, call.index), [])
        watchers.append(watch)
        return lambda: watchers.remove(watch)

    def _entering(self, name: str, leaf: bool) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def enter(_module: nn.Module, _args: tuple[Any, ...]) -> None:
            if not self._owners:  # the root's forward: a new pass
                self._counts.clear()
                self._mode = _Mode(self)
                self._mode.__enter__()  # type: ignore[no-untyped-call]
            self._owners.append((name, leaf))

        return enter

    def _leaving(self, _module: nn.Module, _args: tuple[Any, ...], _output: object) -> None:
        if self._owners:
            self._owners.pop()
        if not self._owners:
            self._leave_mode()

    def _leave_mode(self) -> None:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        self._owners.clear()

    def call(
        self, found: tuple[str, OpKind], func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        target, kind = found
        owner = self._owners[-1][0]
        index = self._counts[owner, target]
        self._counts[owner, target] += 1
        key = (owner, target, index)
        watchers = self._observers.get(key)
        if watchers is None and key in self._seen_keys and key not in self._watchers:
            return func(*args, **kwargs)  # the calibration hot path: a call nobody observes
        tensors = [a for a in _operands(kind, args) if isinstance(a, torch.Tensor)]
        if key not in self._seen_keys:
            self._seen_keys.add(key)
            if (
                not tensors or tensors[0].is_floating_point()
            ):  # integer arithmetic (positions, masks) is never quantized
                call = OpCall(owner=owner, target=target, index=index)
                self.seen[call] = (kind, tensors[0].dim() if tensors else 0)
                weight = args[1] if len(args) > 1 else kwargs.get("weight")
                if kind.is_layer and isinstance(weight, torch.Tensor):
                    self.weights[call] = id(weight)
        watchers = watchers or {}
        # (this handler runs with the mode off: the observers' own calls are not seen)
        for side, operand in zip((Side.PRE, Side.OTHER), tensors):
            for observe in watchers.get(side, ()):
                observe(operand)
        output = func(*args, **kwargs)
        if isinstance(output, torch.Tensor):
            for observe in watchers.get(Side.POST, ()):
                observe(output)
            for watch in self._watchers.get(key, ()):
                watch(tuple(tensors), output)
        return output


def resolve_target(target: str) -> Callable[..., Any] | str:
    """The object FX records for ``target`` (``operator.add``, ``torch.matmul``), or a method's name."""
    if "." not in target:
        return target
    module_name, attribute = target.rsplit(".", 1)
    modules: dict[str, Any] = {"operator": operator, "torch": torch, "torch.nn.functional": F}
    found: Callable[..., Any] = getattr(modules[module_name], attribute)
    return found


__all__ = [
    "CALL_TARGETS",
    "LAYER_TARGETS",
    "CallTap",
    "WatchCall",
    "hidden_calls",
    "is_leaf",
    "resolve_target",
    "unseen",
]
