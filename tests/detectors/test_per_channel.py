"""PerChannelDetector: torch's tests (PEER.md (b) 1-7) ported, and a differential test."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from _data import gaussian_batches
from _models import MLP, ConvBnReluCNN, seeded
from _peers import prepared_fx, torch_model_report, torch_name
from torch import nn
from torch.ao.nn import intrinsic as nni
from torch.ao.quantization import (
    QConfigMapping,
    default_per_channel_qconfig,
    default_qat_qconfig,
    get_default_qconfig,
    get_default_qconfig_mapping,
)
from torch.ao.quantization.fx._model_report.detector import PerChannelDetector as TorchPerChannel

import qinsight
from qinsight.detectors import PerChannelDetector, PerChannelFinding
from qinsight.errors import InvalidParameterError
from qinsight.outputs.serde import report_from_json, report_to_dict


def per_channel(report: qinsight.Report) -> dict[str, PerChannelFinding]:
    findings = report.result("qinsight.per_channel").findings
    return {f.fqn: f for f in findings if isinstance(f, PerChannelFinding)}


def run(
    model: nn.Module, data: list[torch.Tensor], backend: str, mapping: QConfigMapping | None = None
) -> qinsight.Report:
    return qinsight.diagnose(
        model,
        data,
        detectors=[PerChannelDetector(backend=backend)],
        deploy=qinsight.types.Deployment(backend=backend, qconfig_mapping=mapping),
    )


class ConvModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv(x)
        return out


def test_simple_conv_with_per_channel_qconfig_needs_nothing() -> None:
    # torch 1
    x = torch.randn(2, 3, 8, 8)
    mapping = QConfigMapping().set_global(get_default_qconfig("fbgemm"))
    report = run(prepared_fx(ConvModel().eval(), x, mapping), [x], "fbgemm")
    finding = per_channel(report)["conv"]
    assert (finding.supported, finding.used, finding.actionable) == (True, True, False)
    assert "per-channel in use (1): conv" in qinsight.to_text(report)


def test_linear_model_without_per_channel() -> None:
    # torch 2: qnnpack's default weight observer is per tensor.
    x = torch.randn(4, 16)
    mapping = QConfigMapping().set_global(get_default_qconfig("qnnpack"))
    report = run(prepared_fx(seeded(MLP()), x, mapping), [x], "qnnpack")
    findings = per_channel(report)
    assert sorted(findings) == ["fc1", "fc2", "fc3"]
    assert all(f.supported and not f.used and f.actionable for f in findings.values())
    assert "per-channel recommended (3)" in qinsight.to_text(report)


def test_without_a_plan_per_channel_is_recommended_not_said_missing() -> None:
    # No qconfig mapping and no qconfig on the modules: how the weights will be quantized is
    # unknown, so the finding recommends per-channel without claiming it is not used.
    x = torch.randn(4, 16)
    report = run(seeded(MLP()), [x], "x86")
    findings = per_channel(report)
    assert all(f.actionable and not f.used and not f.plan_known for f in findings.values())
    reason = findings["fc1"].reason()
    assert "no qconfig mapping given" in reason and "not quantized per channel" not in reason
    planned = per_channel(run(seeded(MLP()), [x], "x86", get_default_qconfig_mapping("x86")))
    assert all(f.plan_known and f.used and not f.actionable for f in planned.values())
    per_tensor = per_channel(
        run(seeded(MLP()), [x], "x86", QConfigMapping().set_global(get_default_qconfig("qnnpack")))
    )
    assert all(f.plan_known and "not quantized per channel" in f.reason() for f in per_tensor.values())


def test_files_of_schema_1_1_read_plan_known_as_true() -> None:
    # 1.2 added plan_known; a 1.1 file has none and means a known plan (the only kind it wrote).
    data = report_to_dict(run(seeded(MLP()), [torch.randn(4, 16)], "x86"))
    data["schema_version"] = [1, 1]
    for result in data["results"]:
        for finding in result["findings"]:
            finding.pop("plan_known", None)
    loaded = report_from_json(json.dumps(data))
    assert all(f.plan_known for f in per_channel(loaded).values())


def test_multiple_qconfig_options() -> None:
    # torch 3: global qnnpack, per-channel for Conv2d only.
    x = torch.randn(2, 3, 8, 8)
    mapping = (
        QConfigMapping()
        .set_global(get_default_qconfig("qnnpack"))
        .set_object_type(nn.Conv2d, default_per_channel_qconfig)
    )
    report = run(seeded(ConvBnReluCNN()), [x], "qnnpack", mapping)
    used = {fqn: f.used for fqn, f in per_channel(report).items()}
    assert used == {"conv1": True, "block.0": True, "fc": False}


def test_sequential_model_format() -> None:
    # torch 4: nested Sequential conv/linear, all supported and not used.
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()),
        nn.Conv2d(4, 4, 3),
        nn.Flatten(),
        nn.Sequential(nn.Linear(4 * 4 * 4, 8), nn.Linear(8, 2)),
    ).eval()
    mapping = QConfigMapping().set_global(get_default_qconfig("qnnpack"))
    report = run(model, [torch.randn(2, 3, 8, 8)], "qnnpack", mapping)
    findings = per_channel(report)
    assert list(findings) == ["0.0", "1", "3.0", "3.1"]
    assert all(f.supported and not f.used for f in findings.values())


def test_conv_subclass_considered() -> None:
    # torch 5: LazyConv2d is a Conv2d.
    model = nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(1, 3, 6, 6)
    model(x)  # materialize
    report = run(model.eval(), [x], "fbgemm")
    assert {f.kind.value for f in per_channel(report).values()} == {"conv2d", "linear"}


def test_fusion_layer_in_sequential() -> None:
    # torch 6: pre-fused ConvReLU2d / LinearReLU under fbgemm's per-channel default.
    model = nn.Sequential(
        nni.ConvReLU2d(nn.Conv2d(3, 4, 3), nn.ReLU()),
        nni.ConvReLU2d(nn.Conv2d(4, 4, 3), nn.ReLU()),
        nn.Flatten(),
        nni.LinearReLU(nn.Linear(4 * 2 * 2, 8), nn.ReLU()),
        nni.LinearReLU(nn.Linear(8, 2), nn.ReLU()),
    ).eval()
    mapping = get_default_qconfig_mapping("fbgemm")
    report = run(model, [torch.randn(2, 3, 6, 6)], "fbgemm", mapping)
    findings = per_channel(report)
    assert list(findings) == ["0", "1", "3", "4"]  # the fused modules' own names
    assert all(f.used and not f.actionable for f in findings.values())


def test_qat_model() -> None:
    # torch 7: eager prepare_qat on a fused conv-bn-relu; the default QAT weight fake-quant is per tensor.
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    model.train()
    model = torch.ao.quantization.fuse_modules_qat(model, [["0", "1", "2"]])
    model.qconfig = default_qat_qconfig  # type: ignore[assignment]
    model = torch.ao.quantization.prepare_qat(model)
    report = run(model, [torch.randn(2, 3, 6, 6)], "fbgemm")
    (finding,) = per_channel(report).values()
    assert finding.fqn == "0" and finding.supported and not finding.used


@pytest.mark.parametrize("backend", ["fbgemm", "qnnpack", "onednn", "x86"])
@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_differential_against_torch(backend: str, model_name: str) -> None:
    model = seeded(MLP()) if model_name == "mlp" else seeded(ConvBnReluCNN())
    data = gaussian_batches((4, 16) if model_name == "mlp" else (2, 3, 8, 8), 3)
    prepared = prepared_fx(model, data[0], get_default_qconfig_mapping(backend))
    torch_entries = torch_model_report(prepared, data, {TorchPerChannel(backend=backend)})["per_channel_detector"][1]
    ours = per_channel(run(copy.deepcopy(prepared), data, backend))
    assert len(ours) == len(torch_entries)
    for fqn, finding in ours.items():
        theirs = torch_entries[torch_name(fqn, torch_entries)]
        assert finding.supported == theirs["per_channel_quantization_supported"]
        assert finding.used == theirs["per_channel_quantization_used"]
    # the backends' defaults differ: x86, fbgemm and onednn weights are per channel, qnnpack's per tensor
    assert all(f.used for f in ours.values()) == (backend != "qnnpack")


def test_invalid_backend_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match=r"PerChannelDetector: backend='tpu' is invalid; expected one of"):
        PerChannelDetector(backend="tpu")
