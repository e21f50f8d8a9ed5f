"""From a :class:`~qinsight.core.formats.FormatPlan` (or any Linear → format assignment) to torchao's
``quantize_``: one config object per format, an ``FqnToConfig`` naming every planned Linear, and
the model quantized with it.

The plan measures assignments in place (:func:`applied`): ``quantize_`` swaps a Linear's weight for
a tensor subclass and nothing else, so putting the float ``Parameter`` back restores the model
exactly, far cheaper than a copy of an LLM per measurement. :func:`quantize_formats` quantizes a
copy, as a user would. torchao is an optional extra: without it, one error says what to install.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from qinsight.core.errors import InvalidParameterError, MissingExtraError
from qinsight.core.formats import FormatPlan, WeightFormat

INSTALL_HINT = "the torchao flow needs torchao: pip install 'qinsight[pt2e]'"


def _quantization() -> Any:
    try:
        import torchao.quantization as quantization
    except ImportError as exc:
        raise MissingExtraError(f"{INSTALL_HINT} ({exc})") from exc
    return quantization


def torchao_config(name: str | WeightFormat) -> Any:
    """torchao's config object for one format (``None`` for ``float``: ``FqnToConfig`` skips the layer)."""
    fmt = name if isinstance(name, WeightFormat) else WeightFormat.parse(name)
    if fmt.is_float:
        return None
    q = _quantization()
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


def fqn_to_config(source: FormatPlan | Mapping[str, str]) -> Any:
    """torchao's ``FqnToConfig`` giving every planned Linear its format (a plan, or fqn → format name):
    ``quantize_(model, fqn_to_config(plan))`` is the plan applied."""
    assignment = _assignment(source)
    configs: dict[str, Any] = {}
    by_format = {name: torchao_config(name) for name in set(assignment.values())}
    for fqn, name in assignment.items():
        if by_format[name] is not None:
            configs[fqn] = by_format[name]
    return _quantization().FqnToConfig(fqn_to_config=configs)


def quantize_formats(model: nn.Module, source: FormatPlan | Mapping[str, str]) -> nn.Module:
    """A copy of ``model`` quantized by ``quantize_`` with :func:`fqn_to_config` of ``source``; ``model``
    itself is not changed."""
    quantized = copy.deepcopy(model)
    _checked_layers(quantized, _assignment(source))
    _quantization().quantize_(quantized, fqn_to_config(source), filter_fn=None)
    return quantized


@contextlib.contextmanager
def applied(model: nn.Module, assignment: Mapping[str, str]) -> Iterator[nn.Module]:
    """``model`` itself quantized by ``quantize_`` as ``assignment`` says, for the ``with`` block; every
    Linear's float weight (and whatever else ``quantize_`` set on it) put back on exit."""
    layers = _checked_layers(model, assignment)
    saved = {fqn: (layer.weight, dict(vars(layer))) for fqn, layer in layers.items()}
    try:
        if any(name != "float" for name in assignment.values()):
            _quantization().quantize_(model, fqn_to_config(assignment), filter_fn=None)
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
            raise InvalidParameterError("quantize_formats", "plan", fqn, f"the name of a Linear of this model ({what} there)")
        if not WeightFormat.parse(name).fits(layer.in_features):
            raise InvalidParameterError("quantize_formats", fqn, name, f"a format whose groups divide its {layer.in_features} inputs")
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


__all__ = ["INSTALL_HINT", "applied", "fqn_to_config", "quantize_formats", "state_bytes", "torchao_config"]
