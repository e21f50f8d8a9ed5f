"""What every frontend shares: running a model on a batch, eval mode, and the module-hook view.

The contract a view satisfies, :class:`~qinsight.plugin.ModelView`, lives with
the detector contract, since detectors are what read views.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from qinsight.core.errors import NotFoundError
from qinsight.core.sites import OpCall, OpSite, Side
from qinsight.frontends.calls import CallTap, unseen
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


class ModuleView(ModelViewBase):
    """A view whose sites are submodules: observed with forward hooks.

    Hooks leave the model's code and graph untouched, so detaching them gives
    back exactly the model the user passed. A module called several times per
    forward is observed on every call (``OpSite.calls`` says how many).
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
        if side is Side.PRE:

            def pre_hook(_module: nn.Module, args: tuple[object, ...]) -> None:
                if args and isinstance(args[0], torch.Tensor):
                    observe(args[0])

            return module.register_forward_pre_hook(pre_hook).remove

        def post_hook(_module: nn.Module, _args: tuple[object, ...], output: object) -> None:
            if isinstance(output, torch.Tensor):
                observe(output)

        return module.register_forward_hook(post_hook).remove

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
