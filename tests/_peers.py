"""What the peer does: torch's ModelReport and FX quantization, PT2E, and the measures tests compare with."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.ao.quantization import QConfigMapping, get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

from qinsight.frontends.base import batch_arguments


def torch_model_report(
    prepared: nn.Module, data: Iterable[torch.Tensor], detectors: set[Any]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """torch's ModelReport run on ``prepared`` (a copy is instrumented)."""
    from torch.ao.quantization.fx._model_report.model_report import ModelReport

    report = ModelReport(copy.deepcopy(prepared), detectors)
    calibrated = report.prepare_detailed_calibration()
    with torch.no_grad():
        for batch in data:
            calibrated(batch)
    result: dict[str, tuple[str, dict[str, Any]]] = report.generate_model_report(True)
    return result


def prepared_fx(model: nn.Module, example: torch.Tensor, mapping: QConfigMapping | None = None) -> nn.Module:
    return prepare_fx(copy.deepcopy(model), mapping or get_default_qconfig_mapping("x86"), (example,))


def quantized_fx(
    model: nn.Module, data: list[torch.Tensor], mapping: QConfigMapping | None = None
) -> tuple[nn.Module, nn.Module]:
    """A copy of ``model`` prepared with ``mapping`` (default x86) and calibrated on ``data``, and its convert_fx."""
    prepared = prepared_fx(model, data[0], mapping)
    for batch in data:
        prepared(batch)
    return prepared, convert_fx(copy.deepcopy(prepared))


def torch_name(fqn: str, torch_keys: Iterable[str]) -> str:
    """torch keys fused modules by their child (``fc1.0``); qinsight by the module called (``fc1``)."""
    keys = set(torch_keys)
    return fqn if fqn in keys else f"{fqn}.0"


def quantize(
    model: nn.Module, mapping: QConfigMapping, calibration: list[Any], backend_config: Any = None
) -> nn.Module:
    """What a user does with a mapping: prepare_fx, calibrate, convert_fx."""
    args, kwargs = batch_arguments(calibration[0])
    prepared = prepare_fx(
        copy.deepcopy(model), mapping, tuple(args) + tuple(kwargs.values()), backend_config=backend_config
    )
    with torch.no_grad():
        for batch in calibration:
            args, kwargs = batch_arguments(batch)
            prepared(*args, **kwargs)
    return convert_fx(prepared)


def outputs(model: nn.Module, data: list[Any]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(*batch_arguments(b)[0], **batch_arguments(b)[1]).flatten(1) for b in data])


def sqnr(reference: torch.Tensor, actual: torch.Tensor) -> float:
    return float(10 * torch.log10(reference.pow(2).sum() / (reference - actual).pow(2).sum()))


def cosine(reference: torch.Tensor, actual: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(reference, actual, dim=-1).mean())


def pt2e_quantized(model: nn.Module, calibration: list[torch.Tensor]) -> tuple[torch.fx.GraphModule, nn.Module]:
    """The convert_pt2e model, and torchao's debugger reference (it must come from the same export)."""
    from torchao.quantization.pt2e import _numeric_debugger as torchao_debugger
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    exported = torch.export.export(copy.deepcopy(model), (calibration[0],)).module()
    reference = torchao_debugger.prepare_for_propagation_comparison(exported)
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    for batch in calibration:
        prepared(batch)
    converted: torch.fx.GraphModule = convert_pt2e(prepared)
    return converted, reference
