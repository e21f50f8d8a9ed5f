"""resolution.activations through qinsight, sharing observers with the built-in equalization detector."""

from __future__ import annotations

import torch
from torch import nn

import qinsight
from qinsight_activation_resolution import ActivationResolutionFinding


def batches(wide: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(4):
        x = torch.randn(64, 32, generator=g)
        if wide:
            x[:, [3, 11]] *= 40  # two channels set the per-tensor scale for all 32
        out.append(x)
    return out


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


def test_wide_channels_starve_the_others_and_ask_for_equalization() -> None:
    report = qinsight.diagnose(
        model(), batches(wide=True), detectors=["resolution.activations", "qinsight.equalization"]
    )
    finding = report.result("resolution.activations").finding("0")
    assert isinstance(finding, ActivationResolutionFinding)
    assert finding.widest_channel in (3, 11) and len(finding.starved_channels) >= 28
    assert finding.verdict == "channels starved per-tensor"
    assert "0" in report.equalization_mapping
    assert set(report.equalization_mapping.entries[0].sources) == {"qinsight.equalization", "resolution.activations"}
    with qinsight.instrument(model(), detectors=["resolution.activations", "qinsight.equalization"]) as session:
        keys = [o.key for o in session._instrumenter.observers]
    # one observer per activation, shared by both detectors (equalization also reads each weight, once)
    assert keys == ["0:pre", "2:pre", "0:weight", "2:weight"]


def test_balanced_inputs_are_fine() -> None:
    report = qinsight.diagnose(model(), batches(wide=False), detectors=["resolution.activations"])
    finding = report.result("resolution.activations").finding("0")
    assert finding.verdict == "resolution fine" and not finding.actionable
    suggestion = report.suggestion("0")
    assert suggestion is not None and suggestion.equalize is False
