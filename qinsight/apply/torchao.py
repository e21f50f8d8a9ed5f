"""From a :class:`~qinsight.core.formats.FormatPlan` (or any Linear → format assignment) to torchao's
``quantize_``: one config object per format, an ``FqnToConfig`` naming every planned Linear, and
the model quantized with it.

The plan measures assignments in place (:func:`applied`): ``quantize_`` swaps a Linear's weight for
a tensor subclass and nothing else, so putting the float ``Parameter`` back restores the model
exactly, far cheaper than a copy of an LLM per measurement. :func:`quantize_formats` quantizes a
copy, as a user would. :func:`int8_recipe` is the torchao flow's config of a report's advice (int8
Linears, static or dynamic: :mod:`qinsight.compare.torchao_flow` calibrates and applies it). torchao
is an optional extra: without it, one error says what to install.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from qinsight.core.advice import Advice
from qinsight.core.errors import InvalidParameterError
from qinsight.core.formats import FormatPlan, WeightFormat
from qinsight.core.sites import OpKind, WeightScheme
from qinsight.core.suggestions import ActivationMode

if TYPE_CHECKING:  # the flow's torch side, imported when a model is quantized: a report's mapping needs none of it
    from qinsight.compare.torchao_flow import Int8Recipe


def torchao_quantization() -> Any:
    """``torchao.quantization``, or one error naming the extra (:mod:`qinsight.compare.torchao_flow`)."""
    from qinsight.compare.torchao_flow import torchao_quantization as imported

    return imported()


def torchao_config(name: str | WeightFormat) -> Any:
    """torchao's config object for one format (``None`` for ``float``: ``FqnToConfig`` skips the layer)."""
    fmt = name if isinstance(name, WeightFormat) else WeightFormat.parse(name)
    if fmt.is_float:
        return None
    q = torchao_quantization()
    from torchao.quantization.granularity import PerGroup

    int4 = getattr(torch, "int4")  # torch's stubs lack the sub-byte dtypes
    if fmt.name == "int8":
        return q.Int8WeightOnlyConfig()
    if fmt.name == "int8_dynamic":
        return q.Int8DynamicActivationInt8WeightConfig()
    if fmt.name == "float8":
        return q.Float8WeightOnlyConfig()
    if fmt.dynamic:
        return q.Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, weight_granularity=PerGroup(fmt.group))
    return q.IntxWeightOnlyConfig(weight_dtype=int4, granularity=PerGroup(fmt.group))


def int8_recipe(advice: Advice) -> Int8Recipe:
    """The torchao flow's config of ``advice``: every Linear site int8 as its suggestion says
    (activations dynamic or static, weights per channel or per tensor; without an opinion, static and
    per channel: the baseline the report's suggestions change, as in FX and PT2E, so that a verdict's
    dropped kinds are the config it scored), those it keeps in float left out.
    ``quantize_`` has no int8 config for other layers: they stay float, which a verification reads
    from the converted model."""
    from qinsight.compare.torchao_flow import Int8Layer, Int8Recipe

    suggestions = {s.fqn: s for s in advice.suggestions}
    layers = []
    for site in advice.sites:
        if site.kind is not OpKind.LINEAR:
            continue
        said = suggestions.get(site.fqn)
        if said is not None and said.keep_float:
            continue
        activation = said.activation if said is not None else None
        weight = said.weight if said is not None else None
        layers.append(Int8Layer(site.fqn, activation is ActivationMode.DYNAMIC, weight is not WeightScheme.PER_TENSOR))
    return Int8Recipe(tuple(layers))


def int8_dynamic() -> Any:
    """torchao's own int8 config (what ``qinsight.compare`` quantizes with for the flow): every Linear's
    activations per token, weights per row."""
    return torchao_quantization().Int8DynamicActivationInt8WeightConfig()


def fqn_to_config(source: FormatPlan | Mapping[str, str]) -> Any:
    """torchao's ``FqnToConfig`` giving every planned Linear its format (a plan, or fqn → format name):
    ``quantize_(model, fqn_to_config(plan))`` is the plan applied."""
    assignment = _assignment(source)
    configs: dict[str, Any] = {}
    by_format = {name: torchao_config(name) for name in set(assignment.values())}
    for fqn, name in assignment.items():
        if by_format[name] is not None:
            configs[fqn] = by_format[name]
    return torchao_quantization().FqnToConfig(fqn_to_config=configs)


def quantize_formats(model: nn.Module, source: FormatPlan | Mapping[str, str]) -> nn.Module:
    """A copy of ``model`` quantized by ``quantize_`` with :func:`fqn_to_config` of ``source``; ``model``
    itself is not changed."""
    quantized = copy.deepcopy(model)
    _checked_layers(quantized, _assignment(source))
    torchao_quantization().quantize_(quantized, fqn_to_config(source), filter_fn=None)
    return quantized


@contextlib.contextmanager
def applied(model: nn.Module, assignment: Mapping[str, str]) -> Iterator[nn.Module]:
    """``model`` itself quantized by ``quantize_`` as ``assignment`` says, for the ``with`` block; every
    Linear's float weight (and whatever else ``quantize_`` set on it) put back on exit."""
    layers = _checked_layers(model, assignment)
    saved = {fqn: (layer.weight, dict(vars(layer))) for fqn, layer in layers.items()}
    try:
        if any(name != "float" for name in assignment.values()):
            torchao_quantization().quantize_(model, fqn_to_config(assignment), filter_fn=None)
        yield model
    finally:
        for fqn, (weight, attributes) in saved.items():
            layer = layers[fqn]
            for added in set(vars(layer)) - set(attributes):
                delattr(layer, added)  # torchao binds its own extra_repr on the module
            layer.weight = weight


def _assignment(source: FormatPlan | Mapping[str, str]) -> dict[str, str]:
    if isinstance(source, FormatPlan):
        return {layer.fqn: layer.format for layer in source.layers}
    return dict(source)


def _checked_layers(model: nn.Module, assignment: Mapping[str, str]) -> dict[str, nn.Linear]:
    """The Linears ``assignment`` names, each checked to be one that can take its format."""
    modules = dict(model.named_modules())
    found: dict[str, nn.Linear] = {}
    for fqn, name in assignment.items():
        layer = modules.get(fqn)
        if not isinstance(layer, nn.Linear):
            what = "no module" if layer is None else type(layer).__name__
            raise InvalidParameterError(
                "quantize_formats", "plan", fqn, f"the name of a Linear of this model ({what} there)"
            )
        if not WeightFormat.parse(name).fits(layer.in_features):
            raise InvalidParameterError(
                "quantize_formats", fqn, name, f"a format whose groups divide its {layer.in_features} inputs"
            )
        found[fqn] = layer
    return found


def state_bytes(model: nn.Module, fqns: list[str] | tuple[str, ...]) -> int:
    """The bytes the weights of ``fqns`` take as stored: a torchao weight's inner tensors (its integers,
    scales and zero points), a float weight's own."""
    modules = dict(model.named_modules())
    total = 0
    for fqn in fqns:
        weight = modules[fqn].weight
        flatten = getattr(weight, "__tensor_flatten__", None)
        if callable(flatten) and type(weight) is not nn.Parameter and type(weight) is not torch.Tensor:
            names, _ = flatten()
            total += sum(_nbytes(getattr(weight, name)) for name in names)
        else:
            total += _nbytes(weight)
    return total


def _nbytes(tensor: torch.Tensor) -> int:
    return int(tensor.numel() * tensor.element_size())


__all__ = [
    "applied",
    "fqn_to_config",
    "int8_dynamic",
    "int8_recipe",
    "quantize_formats",
    "state_bytes",
    "torchao_config",
]
