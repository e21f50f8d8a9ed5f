"""From :class:`~qinsight.core.advice.Advice` to a torchao PT2E quantizer (``prepare_pt2e`` / ``convert_pt2e``).

``X86InductorQuantizer`` cannot mix static and dynamic configs: a module-level
dynamic override under a static global config is skipped with a warning and
the module stays static (torchao 0.18). So the report's dynamic modules get a quantizer of their own
(dynamic, those modules only), the static one excludes them, and the two are
composed. Modules kept in float are excluded from both. A per-tensor weight
suggestion gets a per-tensor weight spec. Every override is checked in a
converted graph by tests/apply/test_pt2e.py.

Ops around the layers have no module names the quantizer could be configured
with. The returned quantizer wraps the composed one: after it annotates the
graph, the aten nodes of the ops the report keeps in float (named as the
report names them: :func:`~qinsight.frontends.exported_site_names`) lose their
annotations, and so do nodes whose annotation shares theirs. It then checks
the report's Linear/Conv sites: those the quantizer left unannotated
(X86InductorQuantizer has no Conv1d, for one) are named in a warning and in
its ``unhonoured`` attribute, as are suggested ops it did not find.

For XNNPACK (``backend="xnnpack"``, ExecuTorch's ``XNNPACKQuantizer``, the
``executorch`` extra) one quantizer mixes static and dynamic modules itself: the
global config is its symmetric static per-channel one, a dynamic or per-tensor
layer gets a module config of its own, and the layers kept in float are stripped
after annotation like the ops (its ``set_module_name`` refuses ``None``).

PT2E has no input-weight equalization. Modules the report would equalize are
named in the advice's notes, a warning (and the text report) rather than dropped silently.
torchao is an optional extra: without it, this module raises one error saying
what to install.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from qinsight.core.advice import Advice
from qinsight.core.errors import InvalidParameterError, MissingExtraError
from qinsight.core.sites import OpSite, WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion
from qinsight.frontends import exported_site_names, layer_names, separate_shared_calls, torch_layer_sources

INSTALL_HINT = "PT2E quantization needs torchao: pip install 'qinsight[pt2e]'"


def _torchao() -> Any:
    try:
        from torchao.quantization.pt2e import observer
        from torchao.quantization.pt2e.quantizer import ComposableQuantizer
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

        from qinsight.apply.grouped_x86 import GroupedX86InductorQuantizer
    except ImportError as exc:
        raise MissingExtraError(f"{INSTALL_HINT} ({exc})") from exc
    return x86, GroupedX86InductorQuantizer, ComposableQuantizer, observer


_ANNOTATION = "quantization_annotation"


def _shares_with(annotation: Any, nodes: set[fx.Node]) -> bool:
    """Whether an annotation's specs share a stripped node's (SharedQuantizationSpec on it or its edges)."""
    specs = [*annotation.input_qspec_map.values(), annotation.output_qspec]
    for spec in specs:
        edge_or_node = getattr(spec, "edge_or_node", None)
        touched = edge_or_node if isinstance(edge_or_node, tuple) else (edge_or_node,)
        if any(n in nodes for n in touched):
            return True
    return False


def strip_annotations(model: fx.GraphModule, float_names: set[str]) -> set[str]:
    """Drop the annotations of the op and layer nodes named in ``float_names`` (and of what shares
    theirs); the names found."""
    named = {node: name for node, name in exported_site_names(model).items() if name in float_names}
    stripped = set(named)
    changed = True
    while changed:  # a node sharing a stripped node's spec cannot keep its own
        changed = False
        for node in model.graph.nodes:
            annotation = node.meta.get(_ANNOTATION)
            if node in stripped or annotation is None or not _shares_with(annotation, stripped):
                continue
            stripped.add(node)
            changed = True
    for node in stripped:
        node.meta.pop(_ANNOTATION, None)
    return set(named.values())


def _unannotated_layers(model: fx.GraphModule, fqns: set[str]) -> set[str]:
    """The Linear/Conv sites among ``fqns`` whose aten node the quantizer left unannotated."""
    annotated = {name: node.meta.get(_ANNOTATION) is not None for node, name in layer_names(model).items()}
    return {fqn for fqn in fqns if fqn in annotated and not annotated[fqn]}


def _honouring(
    inner: Any,
    sites: tuple[OpSite, ...],
    suggestions: tuple[QuantSuggestion, ...],
    name: str,
    *,
    left_out: frozenset[str] = frozenset(),
) -> Any:
    """``inner`` (the backend's quantizers, alone or composed), then the sites kept float stripped (but
    the layers in ``left_out``, which ``inner`` leaves out itself) and what it left unquantized recorded
    and warned of (``name``: the backend's quantizer, for the warning)."""
    from torchao.quantization.pt2e.quantizer import Quantizer

    layers = {site.fqn for site in sites if site.kind.is_layer}
    kept_float = {s.fqn for s in suggestions if s.keep_float}
    stripped_names = kept_float - left_out
    quantized_layers = layers - kept_float

    class ReportQuantizer(Quantizer):  # type: ignore[misc]
        """The backend's quantizer, with the report's suggestions kept float applied per node."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.unhonoured: tuple[str, ...] = ()

        def transform_for_annotation(self, model: fx.GraphModule) -> fx.GraphModule:
            result: fx.GraphModule = self.inner.transform_for_annotation(model)
            return result

        def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
            # a reused nn.ReLU would make it raise; a Conv2d subclass's conv it would leave float
            self.inner.annotate(torch_layer_sources(separate_shared_calls(model)))
            found = strip_annotations(model, stripped_names)
            missed = sorted(_unannotated_layers(model, quantized_layers)) + sorted(kept_float - layers - found)
            self.unhonoured = tuple(missed)
            if missed:
                warnings.warn(
                    f"{name} does not apply the report to {len(missed)} sites (left in float, or an op "
                    f"not found in this graph): {', '.join(missed[:10])}{' ...' if len(missed) > 10 else ''}",
                    stacklevel=2,
                )
            return model

        def validate(self, model: fx.GraphModule) -> None:
            self.inner.validate(model)

    return ReportQuantizer()


def per_tensor_weights(config: Any, observer: Any) -> Any:
    weight = dataclasses.replace(
        config.weight,
        qscheme=torch.per_tensor_symmetric,
        ch_axis=None,
        observer_or_fake_quant_ctr=observer.MinMaxObserver.with_args(eps=2**-12),
    )
    return dataclasses.replace(config, weight=weight)


def default_x86_quantizer() -> Any:
    """torchao's ``X86InductorQuantizer`` with its default static config for every module."""
    x86, _grouped, _composable, _observer = _torchao()
    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())


XNNPACK_HINT = "XNNPACK's quantizer comes with ExecuTorch: pip install 'qinsight[executorch]'"


def default_xnnpack_quantizer() -> Any:
    """ExecuTorch's ``XNNPACKQuantizer`` with its symmetric per-channel static config for every module,
    the PT2E documentation's own example."""
    xnnpack = _xnnpack()
    return xnnpack.XNNPACKQuantizer().set_global(xnnpack.get_symmetric_quantization_config(is_per_channel=True))


def _xnnpack() -> Any:
    try:
        from executorch.backends.xnnpack.quantizer import xnnpack_quantizer
    except ImportError as exc:
        raise MissingExtraError(f"{XNNPACK_HINT} ({exc})") from exc
    return xnnpack_quantizer


def xnnpack_advice_quantizer(sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...]) -> Any:
    """``XNNPACKQuantizer`` applying ``suggestions``: symmetric static per-channel by default, a module
    config of its own for each dynamic or per-tensor layer (XNNPACK mixes them), the sites kept in
    float stripped after it annotates (its ``set_module_name`` takes no ``None``)."""
    xnnpack = _xnnpack()
    configs = {
        (channels, dynamic): xnnpack.get_symmetric_quantization_config(is_per_channel=channels, is_dynamic=dynamic)
        for channels in (True, False)
        for dynamic in (False, True)
    }
    inner = xnnpack.XNNPACKQuantizer().set_global(configs[True, False])
    modules = {site.fqn: site.module for site in sites if site.kind.is_layer}
    layers = set(modules)
    for suggestion in (s for s in suggestions if s.fqn in layers and not s.keep_float):
        wanted = (suggestion.weight is not WeightScheme.PER_TENSOR, suggestion.activation is ActivationMode.DYNAMIC)
        if wanted != (True, False):
            inner.set_module_name(modules[suggestion.fqn], configs[wanted])
    return _honouring(inner, sites, suggestions, "XNNPACKQuantizer")


def pt2e_quantizer(advice: Advice, backend: str | None = None) -> Any:
    """A quantizer applying ``advice`` for ``backend`` (default: the advice's own)."""
    return backend_quantizer(backend or advice.backend, advice.sites, advice.suggestions)


def on_top_of(quantizer: Any, sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...]) -> Any:
    """The user's ``quantizer`` (any torchao Quantizer, composed or not) with the layers and ops
    ``suggestions`` keep in float stripped after it annotates: what a plan that starts from it applies.
    Everything else (weight schemes, static or dynamic) stays the quantizer's own."""
    kept_float = tuple(s for s in suggestions if s.keep_float)
    return _honouring(quantizer, sites, kept_float, type(quantizer).__name__)


# The backend each torchao quantizer class quantizes for (subclasses too): what quantizer= implies.
QUANTIZER_BACKENDS: dict[str, str] = {"X86InductorQuantizer": "x86", "XNNPACKQuantizer": "xnnpack"}


def quantizer_backend(quantizer: object) -> str | None:
    """The backend ``quantizer`` quantizes for, seen through composition (``ComposableQuantizer``'s
    quantizers, qinsight's own wrappers' ``inner``): ``None`` where its classes name no backend, or
    more than one."""
    found: set[str] = set()
    pending = [quantizer]
    while pending:
        current = pending.pop()
        found |= {QUANTIZER_BACKENDS[c.__name__] for c in type(current).__mro__ if c.__name__ in QUANTIZER_BACKENDS}
        pending += list(getattr(current, "quantizers", ())) + ([current.inner] if hasattr(current, "inner") else [])
    return found.pop() if len(found) == 1 else None


def planned_backend(owner: str, backend: str | None, quantizer: object | None) -> str:
    """``backend`` as given, else the one the user's ``quantizer`` quantizes for, else x86; one error
    where the two disagree (an ``XNNPACKQuantizer`` judged as x86 would misread every finding)."""
    implied = quantizer_backend(quantizer) if quantizer is not None else None
    if backend is None:
        return implied or "x86"
    if implied is not None and implied != backend:
        expected = f"{implied!r}, the backend your {type(quantizer).__name__} quantizes for (or leave backend out)"
        raise InvalidParameterError(owner, "backend", backend, expected)
    return backend


def backend_quantizer(backend: str, sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...]) -> Any:
    """The PT2E quantizer of ``backend`` (one of :data:`BACKEND_QUANTIZERS`) applying ``suggestions``."""
    return BACKEND_QUANTIZERS[backend](sites, suggestions)


def advice_quantizer(sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...]) -> Any:
    """A quantizer applying ``suggestions`` about ``sites`` (a report's, or a plan's)."""
    x86, grouped, composable, observer = _torchao()
    static_config = x86.get_default_x86_inductor_quantization_config()
    dynamic_config = x86.get_default_x86_inductor_quantization_config(is_dynamic=True)
    # one config object per kind of entry: the grouped quantizer annotates the modules of each in one pass
    per_tensor = {config: per_tensor_weights(config, observer) for config in (static_config, dynamic_config)}
    static = grouped().set_global(static_config)
    dynamic = grouped()
    dynamic_modules = []
    modules = {site.fqn: site.module for site in sites if site.kind.is_layer}
    floated = _floated_modules(modules, suggestions)  # a call kept float alone is stripped instead
    for suggestion in (s for s in suggestions if s.fqn in modules):
        tensor_wise, module = suggestion.weight is WeightScheme.PER_TENSOR, modules[suggestion.fqn]
        if suggestion.keep_float:
            if module in floated:
                static.set_module_name_qconfig(module, None)
        elif suggestion.activation is ActivationMode.DYNAMIC:
            dynamic.set_module_name_qconfig(module, per_tensor[dynamic_config] if tensor_wise else dynamic_config)
            static.set_module_name_qconfig(module, None)
            dynamic_modules.append(module)
        elif tensor_wise:
            static.set_module_name_qconfig(module, per_tensor[static_config])
    inner = composable([dynamic, static]) if dynamic_modules else static
    left_out = frozenset(fqn for fqn, module in modules.items() if module in floated)
    return _honouring(inner, sites, suggestions, "X86InductorQuantizer", left_out=left_out)


def _floated_modules(modules: dict[str, str], suggestions: tuple[QuantSuggestion, ...]) -> set[str]:
    """The modules whose every call (``modules``: each layer site's module) ``suggestions`` keep in float."""
    kept = {s.fqn for s in suggestions if s.keep_float}
    return {module for module in modules.values() if all(f in kept for f, m in modules.items() if m == module)}


# Each PT2E backend's quantizer builder: adding a backend to the PT2E flow is one entry here, its
# name in qinsight.core.flows and, to measure its program, a Lowering in qinsight.compare.lowering.
BACKEND_QUANTIZERS: dict[str, Callable[[tuple[OpSite, ...], tuple[QuantSuggestion, ...]], Any]] = {
    "x86": advice_quantizer,
    "xnnpack": xnnpack_advice_quantizer,
}
# Each backend's default quantizer, and how a comparison names it.
DEFAULT_QUANTIZERS: dict[str, tuple[Callable[[], Any], str]] = {
    "x86": (default_x86_quantizer, "x86 default"),
    "xnnpack": (default_xnnpack_quantizer, "XNNPACKQuantizer, symmetric per-channel"),
}
