"""qinsight.qconfig_mapping(report): float-model names, a global entry, and every named module quantized."""

from __future__ import annotations

import copy

import pytest
import torch
from _data import gaussian_batches, shifting_batches
from _models import MLP, ConvBnReluCNN, seeded
from _peers import prepared_fx
from torch import nn
from torch.ao.quantization import QConfigMapping, get_default_qconfig
from torch.ao.quantization.fx._model_report.detector import DynamicStaticDetector as TorchDynamicStatic
from torch.ao.quantization.fx._model_report.detector import PerChannelDetector as TorchPerChannel
from torch.ao.quantization.fx._model_report.model_report import ModelReport
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight
from qinsight.apply.qconfigs import qconfig_for
from qinsight.types import ActivationMode, QuantSuggestion, WeightScheme


def convert(model: nn.Module, mapping: QConfigMapping, data: list[torch.Tensor]) -> nn.Module:
    prepared = prepare_fx(copy.deepcopy(model), mapping, (data[0],))
    for batch in data:
        prepared(batch)
    return convert_fx(prepared)


def is_quantized(module: nn.Module) -> bool:
    return type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized"))


@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_mapping_quantizes_every_module_it_names(name: str, backend: str) -> None:
    model = seeded(MLP()) if name == "mlp" else seeded(ConvBnReluCNN())
    data = gaussian_batches((8, 16) if name == "mlp" else (2, 3, 8, 8), 4)
    report = qinsight.diagnose(model, data, deploy=backend)
    mapping = qinsight.qconfig_mapping(report)
    assert mapping.global_qconfig is not None
    layers = [s.fqn for s in report.sites if s.kind.is_layer]
    assert [fqn for fqn in mapping.module_name_qconfigs if fqn in layers] == layers
    assert set(mapping.module_name_qconfigs) == {s.fqn for s in report.suggestions if not s.fqn.count("#")}
    quantized = convert(model, mapping, data)
    assert all(is_quantized(quantized.get_submodule(fqn)) for fqn in layers)


def test_torch_mapping_leaves_fused_layers_float_ours_does_not() -> None:
    # PEER.md (c) 5: torch keys its mapping on fc1.0 and has no global; prepare_fx matches neither.
    model, data = seeded(MLP()), gaussian_batches((8, 16), 4)
    torch_report = ModelReport(prepared_fx(model, data[0]), {TorchPerChannel(backend="x86"), TorchDynamicStatic()})
    calibrated = torch_report.prepare_detailed_calibration()
    for batch in data:
        calibrated(batch)
    torch_mapping = torch_report.generate_qconfig_mapping()
    assert set(torch_mapping.module_name_qconfigs) == {"fc1.0", "fc2.0", "fc3"}
    assert torch_mapping.global_qconfig is None
    theirs = convert(model, torch_mapping, data)
    assert not is_quantized(theirs.get_submodule("fc1"))

    ours = convert(model, qinsight.qconfig_mapping(qinsight.diagnose(model, data)), data)
    assert all(is_quantized(ours.get_submodule(fqn)) for fqn in ("fc1", "fc2", "fc3"))


def test_dynamic_suggestion_gives_a_dynamic_module() -> None:
    model = nn.Sequential(nn.Linear(8, 8)).eval()
    with torch.no_grad():
        model[0].weight.uniform_(0.1, 1.0)
    data = shifting_batches((16, 8), 8)
    report = qinsight.diagnose(model, data)
    suggestion = report.suggestion("0")
    assert suggestion is not None and suggestion.activation is ActivationMode.DYNAMIC
    converted = convert(model, qinsight.qconfig_mapping(report), data)
    assert type(converted.get_submodule("0")).__module__.startswith("torch.ao.nn.quantized.dynamic")


def test_keep_float_and_per_tensor_suggestions() -> None:
    default = get_default_qconfig("x86")
    assert qconfig_for(QuantSuggestion(fqn="a", keep_float=True), default) is None
    per_tensor = qconfig_for(QuantSuggestion(fqn="a", weight=WeightScheme.PER_TENSOR), default)
    assert per_tensor is not None and not hasattr(per_tensor.weight(), "ch_axis")
    unchanged = qconfig_for(QuantSuggestion(fqn="a"), default)
    assert unchanged == default


def test_base_mapping_is_kept_and_not_mutated(mlp: nn.Module) -> None:
    base = QConfigMapping().set_object_type(nn.ReLU, None)
    mapping = qinsight.qconfig_mapping(qinsight.diagnose(mlp, gaussian_batches((8, 16), 3)), base=base)
    assert mapping.object_type_qconfigs[nn.ReLU] is None
    assert mapping.global_qconfig is None and "fc1" in mapping.module_name_qconfigs
    assert not base.module_name_qconfigs  # the caller's mapping is untouched
