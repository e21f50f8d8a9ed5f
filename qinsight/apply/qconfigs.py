"""From :class:`~qinsight.core.advice.Advice` to a torch ``QConfigMapping`` for FX graph mode quantization.

The mapping starts from ``base`` (the backend's default mapping unless given),
so the global entry and the object-type entries are kept, and adds one entry
per suggestion. Modules are named as in the float model (``fc1``, the parent
of a fused ``LinearReLU``: torch's ModelReport uses ``fc1.0``, which
``prepare_fx`` never matches, so it leaves fused layers in float). Functional
calls (``x + y`` in a module's forward) get order entries
(``set_module_name_object_type_order``), tensor methods (``x.softmax(-1)``) the
only entry FX has for them, their name (for every call: a warning says so).
Embeddings get torch's weight-only float-qparams qconfig, the only one
``prepare_fx`` accepts for them (the default mapping makes it raise).

With ``advice.fx_activations`` (:mod:`qinsight.core.fx_activations`), the
global entry observes 8 bits, a layer that a clip alone reads is observed as
the clip leaves it (:mod:`.clipped`), and the inputs of kernels that saturate
stay at 7 bits; with a ``base`` of your own, its observers are kept.

:func:`advice_entries` is the one list both :func:`qconfig_mapping` and the
pasteable code (:mod:`.code`) are made from.
"""

from __future__ import annotations

import copy
import operator
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch.ao.quantization import (
    QConfig,
    QConfigMapping,
    default_dynamic_quant_observer,
    default_per_channel_weight_observer,
    default_weight_observer,
    float_qparams_weight_only_qconfig,
    get_default_qconfig,
    get_default_qconfig_mapping,
)
from torch.ao.quantization.observer import HistogramObserver

from qinsight.apply.clipped import ClippedHistogramObserver
from qinsight.core.advice import Advice
from qinsight.core.fx_activations import FxActivations
from qinsight.core.sites import OpKind, OpSite, WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion
from qinsight.frontends import resolve_target


@attrs.frozen
class Choice:
    """A qconfig and the code that builds it (in a namespace holding ``default`` and ``defaults``)."""

    qconfig: QConfig | None
    code: str


@attrs.frozen
class MappingEntry:
    """One ``QConfigMapping`` setter call: ``setter(*key, choice.qconfig)``."""

    setter: str  # set_module_name, set_module_name_object_type_order or set_object_type
    key: tuple[Any, ...]
    key_code: tuple[str, ...]
    choice: Choice
    fqn: str  # the site it is for


@attrs.frozen
class Observer:
    """An activation observer's constructor and the code that builds it."""

    factory: Any
    code: str


def suggested(suggestion: QuantSuggestion, default: QConfig, observer: Observer | None = None) -> Choice:
    """The qconfig that applies ``suggestion``; fields without an opinion keep ``default``'s choice
    (its static activations ``observer``'s, where given)."""
    if suggestion.keep_float:
        return Choice(None, "None")
    activation, activation_code = (
        (default.activation, "default.activation") if observer is None else (observer.factory, observer.code)
    )
    if suggestion.activation is ActivationMode.DYNAMIC:
        activation, activation_code = default_dynamic_quant_observer, "default_dynamic_quant_observer"
    weight, weight_code = default.weight, "default.weight"
    if suggestion.weight is WeightScheme.PER_CHANNEL:
        weight, weight_code = default_per_channel_weight_observer, "default_per_channel_weight_observer"
    elif suggestion.weight is WeightScheme.PER_TENSOR:
        weight, weight_code = default_weight_observer, "default_weight_observer"
    qconfig = QConfig(activation=activation, weight=weight)  # type: ignore[no-untyped-call]
    return Choice(qconfig, f"QConfig(activation={activation_code}, weight={weight_code})")


def qconfig_for(suggestion: QuantSuggestion, default: QConfig) -> QConfig | None:
    return suggested(suggestion, default).qconfig


def _object_code(obj: object) -> str:
    """Code naming ``obj`` (``operator.add``, ``F.softmax``, ``torch.matmul``)."""
    name = getattr(obj, "__name__", "")
    for prefix, namespace in (("operator", operator), ("F", F), ("torch", torch)):
        if getattr(namespace, name, None) is obj:
            return f"{prefix}.{name}"
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', name)}"


def _entry(site: OpSite | None, fqn: str, choice: Choice) -> MappingEntry:
    """The entry for one site: its module's name, or the order entry of a functional call."""
    call = site.call if site is not None else None
    if call is None:  # a module's calls share its entry (advice_of merged what they were advised)
        module = site.module if site is not None else fqn
        return MappingEntry("set_module_name", (module,), (repr(module),), choice, fqn)
    if call.is_method:  # FX configures methods by name only
        return MappingEntry("set_object_type", (call.target,), (repr(call.target),), choice, fqn)
    target = resolve_target(call.target)
    return MappingEntry(
        "set_module_name_object_type_order",
        (call.owner, target, call.index),
        (repr(call.owner), _object_code(target), str(call.index)),
        choice,
        fqn,
    )


# Ops that are no sites and that FX quantizes under the global qconfig sharing their input's observer:
# the shape ops, which move values without changing them, and mean. FX quantizes them between float
# ops too, where the quantize/dequantize pair it puts around them is pure error (MiniLM with every
# site in float: cosine 0.9986, its attention's views and transposes quantized; the encoder
# example's final mean, 2.5 dB). Between quantized ops, kept float, they cost a requantization
# (their consumer observes what they output).
FOLLOWER_FUNCTIONS = (
    torch.flatten,
    torch.mean,
    torch.narrow,
    torch.repeat_interleave,
    torch.squeeze,
    torch.transpose,
    torch.unsqueeze,
)
FOLLOWER_METHODS = (
    "contiguous",
    "detach",
    "mean",
    "permute",
    "repeat",
    "repeat_interleave",
    "reshape",
    "squeeze",
    "transpose",
    "unsqueeze",
    "view",
)


def _follower_entries() -> list[MappingEntry]:
    """Every follower op kept float: the entries advice adds once it keeps a site float or dynamic."""
    float_choice = Choice(None, "None")
    functions = [
        MappingEntry("set_object_type", (f,), (_object_code(f),), float_choice, "") for f in FOLLOWER_FUNCTIONS
    ]
    return functions + [MappingEntry("set_object_type", (m,), (repr(m),), float_choice, "") for m in FOLLOWER_METHODS]


def base_qconfig(backend: str, activations: FxActivations | None) -> QConfig:
    """The backend's default qconfig, its activations ``activations.bits`` wide where given."""
    default: QConfig = get_default_qconfig(backend)  # type: ignore[no-untyped-call]
    if activations is None:
        return default
    return QConfig(activation=_histogram(activations.bits), weight=default.weight)  # type: ignore[no-untyped-call]


def _histogram(bits: int) -> Any:
    return HistogramObserver.with_args(reduce_range=bits < 8)


def _observer_entries(
    all_sites: tuple[OpSite, ...], suggestions: dict[str, QuantSuggestion], activations: FxActivations
) -> dict[str, Observer]:
    """The activation observer of each site whose observing differs from the base qconfig's: a layer
    is clipped where a clip alone reads it and another site's qconfig makes its input's observer
    (its own would observe the input clipped too); the site whose observer a saturating kernel
    reads is 7 bits wide."""
    sites = {site.fqn: site for site in all_sites}

    def static(fqn: str | None) -> bool:
        site = sites.get(fqn) if fqn is not None else None
        advice = suggestions.get(fqn) if fqn is not None else None
        unquantized = advice is not None and (advice.keep_float or advice.activation is ActivationMode.DYNAMIC)
        return site is not None and site.quantized and not unquantized

    def input_observer_owner(fqn: str) -> str:
        """The site whose qconfig makes the observer of ``fqn``'s input. Back through the ops that run
        on their input's quantized tensor and keep its qparams (a hardtanh, a pool: FX runs them so
        between quantized ops even when told to keep them float), the producer if it is quantized
        statically, else the first of those ops that is, else ``fqn`` itself."""
        sharing, source = [], sites[fqn].source
        while source is not None and source in sites and sites[source].kind in (OpKind.HARDTANH, OpKind.POOL):
            sharing.append(source)
            source = sites[source].source
        if static(source):
            return str(source)
        return next((op for op in reversed(sharing) if static(op)), fqn)

    narrow = {input_observer_owner(fqn) for fqn in activations.narrowed_fqns if fqn in sites}
    choices: dict[str, Observer] = {}
    for site in all_sites:
        if not static(site.fqn):
            continue
        bits = 7 if site.fqn in narrow else activations.bits
        if (
            site.kind.is_layer
            and site.call is None
            and site.clip is not None
            and input_observer_owner(site.fqn) != site.fqn
        ):
            lower, upper = site.clip
            choices[site.fqn] = Observer(
                ClippedHistogramObserver.with_args(lower=lower, upper=upper, reduce_range=bits < 8),
                f"ClippedHistogramObserver.with_args(lower={lower!r}, upper={upper!r}, reduce_range={bits < 8})",
            )
        elif bits != activations.bits:
            choices[site.fqn] = Observer(_histogram(bits), f"HistogramObserver.with_args(reduce_range={bits < 8})")
    narrowed = {fqn for fqn in narrow if activations.bits == 8}
    return _one_per_module(choices, all_sites, narrowed)


def _one_per_module(
    choices: dict[str, Observer], all_sites: tuple[OpSite, ...], narrowed: set[str]
) -> dict[str, Observer]:
    """``choices`` as FX can apply them: one observer for every call of a module (``set_module_name``).
    Where its calls' observers differ, none is clipped (a clip one call's output does not pass through would
    cut it off) and any call's narrowing to 7 bits narrows them all (a saturating kernel reads each call)."""
    calls: dict[str, list[str]] = {}
    for site in all_sites:
        if site.call is None:
            calls.setdefault(site.module, []).append(site.fqn)
    for names in calls.values():
        chosen = [choices.get(name) for name in names]
        if len(names) < 2 or all(choice == chosen[0] for choice in chosen):
            continue
        for name in names:
            choices.pop(name, None)
            if any(other in narrowed for other in names):
                choices[name] = Observer(_histogram(7), "HistogramObserver.with_args(reduce_range=True)")
    return choices


def advice_entries(
    all_sites: tuple[OpSite, ...],
    suggestions: tuple[QuantSuggestion, ...],
    backend: str,
    activations: FxActivations | None = None,
) -> list[MappingEntry]:
    """The setter calls applying ``suggestions`` about ``all_sites`` (a report's, or a plan's); where
    they keep a site float or dynamic, the ops that follow their input's quantization float too
    (:data:`FOLLOWER_METHODS`). With ``activations``, the global qconfig and each layer observe as it
    says (:mod:`qinsight.core.fx_activations`)."""
    if not all_sites:
        return []  # advice about no site (a file holding a comparison only, no backend recorded)
    default = base_qconfig(backend, activations)
    float_qparams = Choice(float_qparams_weight_only_qconfig, "float_qparams_weight_only_qconfig")
    sites = {site.fqn: site for site in all_sites}
    suggested_fqns = {s.fqn for s in suggestions}
    unquantized = any(s.keep_float or s.activation is ActivationMode.DYNAMIC for s in suggestions)
    entries = [MappingEntry("set_global", (), (), Choice(default, "default"), "")] if activations is not None else []
    entries += _follower_entries() if unquantized else []
    observers = (
        _observer_entries(all_sites, {s.fqn: s for s in suggestions}, activations) if activations is not None else {}
    )
    plain = QuantSuggestion(fqn="")
    entries += [
        _entry(sites[fqn], fqn, suggested(plain, default, observer))
        for fqn, observer in observers.items()
        if fqn not in suggested_fqns
    ]
    entries += [
        _entry(site, site.fqn, float_qparams)
        for site in all_sites
        if site.kind is OpKind.EMBEDDING and site.quantized and site.fqn not in suggested_fqns
    ]
    for suggestion in suggestions:
        site = sites.get(suggestion.fqn)
        if site is not None and site.kind is OpKind.EMBEDDING and not suggestion.keep_float:
            if site.quantized:  # only float qparams work for embeddings, whatever else was suggested
                entries.append(_entry(site, suggestion.fqn, float_qparams))
            continue
        entries.append(_entry(site, suggestion.fqn, suggested(suggestion, default, observers.get(suggestion.fqn))))
    return entries


def _warn_methods(entries: list[MappingEntry]) -> None:
    methods = sorted({e.fqn for e in entries if e.setter == "set_object_type" and e.fqn})
    if methods:
        warnings.warn(
            "FX configures tensor methods (x.softmax(...)) for the whole model, not per call: the settings of "
            + ", ".join(methods)
            + " apply to every call of those methods",
            stacklevel=4,
        )


def qconfig_mapping(advice: Advice, base: QConfigMapping | None = None) -> QConfigMapping:
    """The QConfigMapping applying ``advice`` to ``base`` (the backend's default): its activations observed
    as ``advice.fx_activations`` says, unless ``base`` is given (then as ``base``'s qconfigs say)."""
    activations = advice.fx_activations if base is None else None
    return advice_mapping(advice.sites, advice.suggestions, advice.backend, base, activations)


def advice_mapping(
    sites: tuple[OpSite, ...],
    suggestions: tuple[QuantSuggestion, ...],
    backend: str,
    base: QConfigMapping | None = None,
    activations: FxActivations | None = None,
) -> QConfigMapping:
    """The QConfigMapping applying ``suggestions`` about ``sites`` to ``base`` (the backend's default),
    observing activations as ``activations`` says (torch's default way where ``None``)."""
    return _applied(advice_entries(sites, suggestions, backend, activations), backend, base)


def _applied(entries: list[MappingEntry], backend: str, base: QConfigMapping | None) -> QConfigMapping:
    mapping = copy.deepcopy(base) if base is not None else get_default_qconfig_mapping(backend)
    _warn_methods(entries)
    for entry in entries:
        setter: Callable[..., QConfigMapping] = getattr(mapping, entry.setter)
        setter(*entry.key, entry.choice.qconfig)
    return mapping
