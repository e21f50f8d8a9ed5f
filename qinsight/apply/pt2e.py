"""From :class:`~qinsight.core.advice.Advice` to a PT2E quantizer (``prepare_pt2e`` / ``convert_pt2e``).

Each backend's record (:mod:`qinsight.backends`) builds its quantizer from advice; what they share
is here. Ops around the layers have no module names a quantizer could be configured with, and a call
of a shared module none either: :func:`honouring` wraps the backend's quantizer so that, after it
annotates the graph, the aten nodes of the sites the advice keeps in float (named as the report names
them: :func:`~qinsight.frontends.exported_site_names`) lose their annotations, and so do nodes whose
annotation shares theirs. It then checks the advice's Linear/Conv sites: those the quantizer left
unannotated (X86InductorQuantizer has no Conv1d, for one) are named in a warning and in its
``unhonoured`` attribute, as are suggested ops it did not find.

PT2E has no input-weight equalization. Modules the report would equalize are named in the advice's
notes, a warning (and the text report) rather than dropped silently. torchao is an optional extra:
without it, a backend's quantizer raises one error saying what to install.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
from torch import fx

from qinsight.core.advice import Advice
from qinsight.core.backend import PT2E_HINT
from qinsight.core.errors import MissingExtraError
from qinsight.core.flows import pt2e_quantizers
from qinsight.core.sites import OpSite
from qinsight.core.suggestions import QuantSuggestion
from qinsight.frontends import exported_site_names, layer_names, separate_shared_calls, torch_layer_sources

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


def honouring(
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
    try:
        from torchao.quantization.pt2e.quantizer import Quantizer
    except ImportError as exc:
        raise MissingExtraError(f"{PT2E_HINT} ({exc})") from exc

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


def pt2e_quantizer(advice: Advice, backend: str | None = None) -> Any:
    """A quantizer applying ``advice`` for ``backend`` (default: the advice's own)."""
    return backend_quantizer(backend or advice.backend, advice.sites, advice.suggestions)


def on_top_of(quantizer: Any, sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...]) -> Any:
    """The user's ``quantizer`` (any torchao Quantizer, composed or not) with the layers and ops
    ``suggestions`` keep in float stripped after it annotates: what a plan that starts from it applies.
    Everything else (weight schemes, static or dynamic) stays the quantizer's own."""
    kept_float = tuple(s for s in suggestions if s.keep_float)
    return honouring(quantizer, sites, kept_float, type(quantizer).__name__)


def backend_quantizer(
    backend: str, sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...], owner: str = "pt2e_quantizer"
) -> Any:
    """The PT2E quantizer of ``backend`` (its record's :attr:`~qinsight.core.backend.Pt2eQuantizers.from_advice`)
    applying ``suggestions``; one error naming the flow that serves ``backend`` where PT2E does not."""
    return pt2e_quantizers(owner, backend).from_advice(sites, suggestions)


def floated_modules(modules: dict[str, str], suggestions: tuple[QuantSuggestion, ...]) -> set[str]:
    """The modules whose every call (``modules``: each layer site's module) ``suggestions`` keep in float."""
    kept = {s.fqn for s in suggestions if s.keep_float}
    return {module for module in modules.values() if all(f in kept for f, m in modules.items() if m == module)}


__all__ = [
    "backend_quantizer",
    "floated_modules",
    "honouring",
    "on_top_of",
    "per_tensor_weights",
    "pt2e_quantizer",
    "strip_annotations",
]
