"""What every frontend shares: running a model on a batch, eval mode, and the module-hook view.

The contract a view satisfies, :class:`~qinsight.plugin.ModelView`, lives with
the detector contract, since detectors are what read views.
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from qinsight.core.errors import NotFoundError
from qinsight.core.sites import OpCall, OpSite, Side
from qinsight.frontends.calls import CallTap, unseen
from qinsight.frontends.modules import classify
from qinsight.plugin.detector import Detach


def batch_arguments(batch: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments a batch stands for: a tensor, a tuple/list of positional
    args, or a mapping of keyword args."""
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    raise TypeError(
        f"a calibration batch must be a tensor, a tuple of positional arguments or a mapping of keyword "
        f"arguments, not {type(batch).__name__}"
    )


def example_inputs(batch: object) -> tuple[Any, ...]:
    """A batch's arguments as the one tuple ``prepare_fx`` takes as example inputs (keyword
    arguments in their order after the positional ones)."""
    args, kwargs = batch_arguments(batch)
    return tuple(args) + tuple(kwargs.values())


def run_batch(model: nn.Module, batch: object) -> object:
    """Call ``model`` on one batch (see :func:`batch_arguments`)."""
    args, kwargs = batch_arguments(batch)
    return model(*args, **kwargs)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Every submodule in eval mode inside the block, its own training flag restored after.

    Flags are set directly: ``model.eval()`` raises on an exported program's
    module, whose mode was fixed when it was exported.
    """
    modes = {module: module.training for module in model.modules()}
    try:
        for module in modes:
            module.training = False
        yield
    finally:
        for module, training in modes.items():
            module.training = training


_HOOKS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)


def shared_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s modules that shares its parameters (buffers are copied: a forward may
    update one in place). What ``prepare_fx``, ``convert_fx`` and torch's equalization rewrite: they
    swap modules and assign new weights, never write into one, so the weights need no copy. A deep
    copy of four 7B-width decoder layers took 5.9 s, about a seventh of ``report()`` on the CPU."""
    return copy.deepcopy(model, {id(p): p for p in model.parameters()})


def hookless_copy(model: nn.Module) -> nn.Module:
    """A :func:`shared_copy` of ``model`` without forward hooks: what a check quantizes or runs while a
    session may be observing the model (inside ``qinsight.instrument``, its observers hook the modules,
    and a copy would carry them and feed its values into the statistics)."""
    copied = shared_copy(model)
    for module in copied.modules():
        for name in _HOOKS:
            hooks = getattr(module, name, None)
            if hooks:
                hooks.clear()
    return copied


def find_site(sites: tuple[OpSite, ...], fqn: str) -> OpSite:
    """The site named ``fqn``; a :class:`NotFoundError` that lists the known sites otherwise."""
    for site in sites:
        if site.fqn == fqn:
            return site
    raise NotFoundError("op site", fqn, (s.fqn for s in sites))


class ModelViewBase:
    """What every view shares: the frontend's name, the model, and the sites found in it."""

    _frontend: str
    _model: nn.Module
    _sites: tuple[OpSite, ...]
    _ops: tuple[OpSite, ...] = ()

    @property
    def frontend(self) -> str:
        return self._frontend

    @property
    def model(self) -> nn.Module:
        return self._model

    @property
    def sites(self) -> tuple[OpSite, ...]:
        return self._sites

    @property
    def ops(self) -> tuple[OpSite, ...]:
        return self._ops

    def site(self, fqn: str) -> OpSite:
        return find_site(self._sites + self._ops, fqn)

    def reconfigure(self, sites: tuple[OpSite, ...], ops: tuple[OpSite, ...]) -> None:
        """The same sites, as another config will quantize them (:mod:`.configured`): only what a config
        decides may differ (a layer's weight scheme, whether an op is quantized)."""
        if [s.fqn for s in sites] != [s.fqn for s in self._sites] or [o.fqn for o in ops] != [o.fqn for o in self._ops]:
            raise ValueError("reconfigure keeps the view's sites, in order")
        self._sites, self._ops = sites, ops


def _hook(module: nn.Module, side: Side, observe: Callable[[torch.Tensor], object]) -> Detach:
    """``observe`` on ``module``'s input (``Side.PRE``) or output on every call."""
    if side is Side.PRE:

        def pre_hook(_module: nn.Module, args: tuple[object, ...]) -> None:
            if args and isinstance(args[0], torch.Tensor):
                observe(args[0])

        return module.register_forward_pre_hook(pre_hook).remove

    def post_hook(_module: nn.Module, _args: tuple[object, ...], output: object) -> None:
        if isinstance(output, torch.Tensor):
            observe(output)

    return module.register_forward_hook(post_hook).remove


class CallIndex:
    """Which call of each counted module is running, in the root's current forward: what tells a hook on a
    module called at several places (one ``nn.ReLU6`` after two convs) which call site it sees. Counting
    hooks (ahead of every other hook) are on the modules while any observer of theirs is attached."""

    def __init__(self, root: nn.Module) -> None:
        self._root = root
        self._users: dict[nn.Module, int] = {}
        self._removers: dict[nn.Module, list[Callable[[], None]]] = {}
        self._calls: dict[nn.Module, int] = {}
        self.running: dict[nn.Module, int] = {}

    def count(self, module: nn.Module) -> Detach:
        """Count ``module``'s calls until the returned detach (counted once however many observers ask)."""
        if not self._users:
            self._removers[self._root] = [self._root.register_forward_pre_hook(self._new_pass, prepend=True).remove]
        if module not in self._users:
            self._removers[module] = [module.register_forward_pre_hook(self._call, prepend=True).remove]
        self._users[module] = self._users.get(module, 0) + 1
        return lambda: self._release(module)

    def _new_pass(self, _module: nn.Module, _args: tuple[object, ...]) -> None:
        self._calls.clear()

    def _call(self, module: nn.Module, _args: tuple[object, ...]) -> None:
        index = self._calls.get(module, 0)
        self._calls[module] = index + 1
        self.running[module] = index

    def _release(self, module: nn.Module) -> None:
        self._users[module] -= 1
        if self._users[module]:
            return
        del self._users[module]
        for remove in self._removers.pop(module):
            remove()
        if not self._users:
            for remove in self._removers.pop(self._root):
                remove()


def module_view(frontend: str, model: nn.Module, sites: tuple[OpSite, ...], ops: tuple[OpSite, ...]) -> ModuleView:
    """The :class:`ModuleView` of ``model``'s ``sites`` (Linear/Conv calls) and ``ops``: each module call
    hooked on its module, each weight read from the module holding it."""
    modules = {site.fqn: model.get_submodule(site.module) for site in sites + ops if site.call is None}
    weights = {}
    for site in sites:
        found = classify(model.get_submodule(site.module))
        if found is not None:
            weights[site.fqn] = found[1]
    return ModuleView(frontend=frontend, model=model, sites=sites, modules=modules, weights=weights, ops=ops)


class ModuleView(ModelViewBase):
    """A view whose sites are submodules: observed with forward hooks.

    Hooks leave the model's code and graph untouched, so detaching them gives
    back exactly the model the user passed. A module called several times per
    forward is a site per call: its hooks observe only their own call (:class:`CallIndex`).
    Functional calls (``x + y``) are observed through a :class:`CallTap`,
    installed while any of them is observed.
    """

    def __init__(
        self,
        *,
        frontend: str,
        model: nn.Module,
        sites: tuple[OpSite, ...],
        modules: dict[str, nn.Module],
        weights: dict[str, nn.Module],
        ops: tuple[OpSite, ...] = (),
    ) -> None:
        self._frontend = frontend
        self._model = model
        self._sites = sites
        self._ops = ops
        self._modules = modules  # fqn -> the module whose call is the site (layers and op modules)
        self._weights = weights  # fqn -> the module holding the weight (the Linear inside a fused LinearReLU)
        self._tap: CallTap | None = None
        self._tapped = 0  # observers attached through the tap
        self._index = CallIndex(model)
        # modules with several call sites: their hooks must tell the calls apart
        self._shared = {
            module
            for module, count in Counter(self._modules[s.fqn] for s in sites + ops if s.fqn in self._modules).items()
            if count > 1
        }

    def weight(self, fqn: str) -> torch.Tensor:
        self.site(fqn)
        weight = self._weights[fqn].weight
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"module {fqn} has no weight tensor")
        return weight.detach()

    def attach(self, fqn: str, side: Side, observe: Callable[[torch.Tensor], object]) -> Detach:
        site = self.site(fqn)
        if site.call is not None:
            return self._attach_call(site.call, side, observe)
        if side is Side.OTHER:
            raise ValueError(f"{fqn} is a module: it has no second operand to observe")
        module = self._modules[fqn]
        observe = unseen(observe)
        if module not in self._shared:
            return _hook(module, side, observe)
        occurrence, index = site.occurrence, self._index

        def own_call(tensor: torch.Tensor) -> object:
            return observe(tensor) if index.running.get(module) == occurrence else None

        stop_counting = index.count(module)
        remove = _hook(module, side, own_call)

        def detach() -> None:
            remove()
            stop_counting()

        return detach

    def _attach_call(self, call: OpCall, side: Side, observe: Callable[[torch.Tensor], object]) -> Detach:
        if self._tap is None:
            self._tap = CallTap(self._model)
            self._tap.install()
        stop = self._tap.observe(call, side, observe)
        self._tapped += 1

        def detach() -> None:
            stop()
            self._tapped -= 1
            if self._tapped == 0 and self._tap is not None:
                self._tap.remove()
                self._tap = None

        return detach
