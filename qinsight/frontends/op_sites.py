"""The ops around the layers, found by running the model once: modules (LayerNorm, ReLU6, Embedding...)
and functional calls (adds, matmuls, softmax...), and whether the FX flow quantizes each.

A site the flow leaves in float is kept, marked ``quantized=False``: a user
reading the report sees it was looked at. What FX quantizes is read the way
``prepare_fx`` decides it: the qconfig ``QConfigMapping`` gives the op (with
torch's precedence, per-call order entries included), and whether the
native backend config, which ``prepare_fx`` uses unless told otherwise, has a
pattern for it.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch
from torch import nn
from torch.ao.quantization import QConfigMapping, get_default_qconfig_mapping

from qinsight.core.errors import FrontendError
from qinsight.core.flows import fx_engine
from qinsight.core.sites import OpCall, OpKind, OpSite, call_site_name
from qinsight.frontends.base import eval_mode, run_batch
from qinsight.frontends.calls import CallTap, is_leaf, resolve_target
from qinsight.frontends.modules import (
    QuantizableModule,
    classify_op,
    quantizable_modules,
    resolve_qconfig,
    site_for_module,
)


@functools.cache
def _native_patterns() -> frozenset[object]:
    """The single-op patterns of torch's native backend config: what ``prepare_fx`` can quantize."""
    import torch.ao.quantization.backend_config.utils  # noqa: F401  the config module reads it without importing it
    from torch.ao.quantization.backend_config import get_native_backend_config

    return frozenset(
        config.pattern
        for config in get_native_backend_config().configs
        if config.pattern is not None and not isinstance(config.pattern, tuple)
    )


def _supported(pattern: object) -> bool:
    patterns = _native_patterns()
    if isinstance(pattern, type):
        return any(isinstance(p, type) and issubclass(pattern, p) for p in patterns)
    return pattern in patterns


def call_qconfig(mapping: QConfigMapping, call: OpCall, owner_type: type) -> object:
    """The qconfig FX gives ``call``: its object type's (else global), overridden by the owning
    module's name, name regex or type, then by an order entry for exactly this call."""
    target = resolve_target(call.target)
    base = mapping.object_type_qconfigs.get(target, mapping.global_qconfig)
    qconfig = resolve_qconfig(mapping, call.owner, owner_type, fallback=base) if call.owner else base
    if call.is_method:
        return qconfig  # FX has no per-call entries for methods
    for (owner, object_type, index), ordered in mapping.module_name_object_type_order_qconfigs.items():
        if owner == call.owner and object_type == target and index == call.index:
            return ordered
    return qconfig


def _inside_leaf(fqn: str, modules: dict[str, nn.Module]) -> bool:
    """Whether one of torch's modules holds it (the LayerNorms of nn.TransformerEncoderLayer): FX calls
    that module whole, so what is inside is not an op it can configure."""
    parts = fqn.split(".")
    return any(is_leaf(modules[".".join(parts[:end])]) for end in range(1, len(parts)))


@attrs.frozen
class ModuleCall:
    """One call of a module in the discovery's forward: the module, which of its calls, its input's rank,
    and how many functional calls the tap had seen before it (its place among them)."""

    fqn: str
    occurrence: int
    rank: int | None
    position: int

    @property
    def name(self) -> str:
        return call_site_name(self.fqn, self.occurrence)


class Discovery:
    """One forward on an example batch, recording what the frontends make sites of: each call of the
    ``layers`` asked for (Linear/Conv modules) and of op modules, in call order, with its input's rank,
    and the functional calls (through a :class:`CallTap`)."""

    def __init__(self, model: nn.Module, layers: tuple[str, ...] = ()) -> None:
        self.model = model
        self.layers = layers
        self.layer_calls: list[ModuleCall] = []
        self.module_calls: list[ModuleCall] = []
        self.tap = CallTap(model)
        self.kinds: dict[str, OpKind] = {}
        modules = dict(model.named_modules())
        for fqn, module in modules.items():
            kind = classify_op(module)
            if fqn and kind is not None and not _inside_leaf(fqn, modules):
                self.kinds[fqn] = kind

    def _counter(self, fqn: str, calls: list[ModuleCall]) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        occurrences = itertools.count()

        def count(_module: nn.Module, args: tuple[Any, ...]) -> None:
            first = args[0] if args else None
            rank = first.dim() if isinstance(first, torch.Tensor) else None
            calls.append(ModuleCall(fqn, next(occurrences), rank, len(self.tap.seen)))

        return count

    def run(self, example: object) -> Discovery:
        modules = dict(self.model.named_modules())
        hooks = [(fqn, self.module_calls) for fqn in self.kinds] + [(fqn, self.layer_calls) for fqn in self.layers]
        removers = [modules[fqn].register_forward_pre_hook(self._counter(fqn, calls)).remove for fqn, calls in hooks]
        tap = self.tap
        try:
            with tap, eval_mode(self.model), torch.no_grad():
                run_batch(self.model, example)
        except Exception as exc:
            raise FrontendError(
                f"the example batch failed in {type(self.model).__name__}: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            for remove in removers:
                remove()
        return self


def with_ops(
    model: nn.Module, example: object, mapping: QConfigMapping | None, backend: str = "x86"
) -> tuple[tuple[OpSite, ...], tuple[OpSite, ...]]:
    """:func:`layer_sites` and :func:`op_sites`, from one forward on ``example``: FX's, whose trace calls
    torch's own modules whole (the Linears inside an ``nn.TransformerEncoderLayer`` are no sites)."""
    modules = dict(model.named_modules())
    candidates = {fqn: found for fqn, found in quantizable_modules(model).items() if not _inside_leaf(fqn, modules)}
    discovery = Discovery(model, tuple(candidates)).run(example)
    return layer_sites(discovery, candidates, mapping), op_sites(discovery, mapping, backend)


def layer_sites(
    discovery: Discovery, candidates: Mapping[str, QuantizableModule], mapping: QConfigMapping | None
) -> tuple[OpSite, ...]:
    """Every call of a Linear/Conv, in call order, a site each (``fc``, ``fc#1``...): a call of one of
    torch's modules is read at the module's input and output; a module whose own forward makes the
    functional call on its weight (a padding ``Conv2d`` subclass, which pads, then calls ``F.conv2d``:
    FX traces into it) is read at that call, where its quantized form reads too; a functional call on
    a layer's weight elsewhere (a tied weight) is a call of that layer."""
    tap = discovery.tap
    by_weight = {id(found.holder.weight): fqn for fqn, found in candidates.items()}
    order = {call: index for index, call in enumerate(tap.seen)}
    functional = [(call, by_weight[weight]) for call, weight in tap.weights.items() if weight in by_weight]
    inside = {fqn for call, fqn in functional if call.owner == fqn}  # the module's call is its functional one
    keyed: list[tuple[tuple[int, int], str, OpCall | None, int | None]] = [
        ((call.position, 0), call.fqn, None, call.rank) for call in discovery.layer_calls if call.fqn not in inside
    ]
    keyed += [((order[call], 1), fqn, call, tap.seen[call][1]) for call, fqn in functional]
    occurrences: Counter[str] = Counter()
    sites = []
    for _, fqn, call, rank in sorted(keyed, key=lambda entry: entry[0]):
        found = candidates[fqn]
        site = site_for_module(fqn, found.module, found.kind, found.holder, occurrences[fqn], mapping)
        occurrences[fqn] += 1
        sites.append(attrs.evolve(site, call=call, input_rank=rank))
    return tuple(sites)


def op_sites(discovery: Discovery, mapping: QConfigMapping | None, backend: str = "x86") -> tuple[OpSite, ...]:
    """The op sites that are not Linear/Conv, in the order the discovery's forward met them.

    ``quantized`` is read against ``mapping``, or the backend's default mapping
    when none is given (what ``qinsight.qconfig_mapping(report)`` starts from).
    """
    model, tap = discovery.model, discovery.tap
    mapping = mapping if mapping is not None else get_default_qconfig_mapping(fx_engine(backend))
    modules = dict(model.named_modules())
    module_sites = [
        (
            call.position,
            OpSite(
                fqn=call.name,
                occurrence=call.occurrence,
                kind=discovery.kinds[call.fqn],
                module_type=type(modules[call.fqn]).__name__,
                quantized=_supported(type(modules[call.fqn]))
                and resolve_qconfig(mapping, call.fqn, type(modules[call.fqn])) is not None,
                input_rank=call.rank or 0,
            ),
        )
        for call in discovery.module_calls
    ]
    call_sites = [
        (
            index,
            OpSite(
                fqn=call.name,
                kind=kind,
                module_type=call.target,
                call=call,
                quantized=_supported(resolve_target(call.target))
                and call_qconfig(mapping, call, type(modules[call.owner])) is not None,
                input_rank=rank,
            ),
        )
        for index, (call, (kind, rank)) in enumerate(tap.seen.items())
        if not kind.is_layer
    ]
    # forward order: a module after the calls seen before it, ahead of the calls after it
    keyed = [((position, 0), site) for position, site in module_sites]
    keyed += [((index, 1), site) for index, site in call_sites]
    ordered = [site for _, site in sorted(keyed, key=lambda pair: pair[0])]
    names = {site.fqn for site in ordered}
    if len(names) < len(ordered):
        raise FrontendError("two op sites share a name; a module name holding '#' cannot be told from a call")
    return tuple(ordered)


__all__ = ["Discovery", "ModuleCall", "call_qconfig", "layer_sites", "op_sites", "with_ops"]
