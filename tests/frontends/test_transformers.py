"""Models torch's ModelReport crashes on: (batch, seq, features) Linear inputs and nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
from _data import gaussian_batches
from _peers import prepared_fx, torch_model_report
from torch import nn
from torch.ao.quantization.fx._model_report.detector import (
    InputWeightEqualizationDetector as TorchEqualization,
)
from torch.ao.quantization.fx._model_report.detector import OutlierDetector as TorchOutlier

import qinsight
from qinsight.detectors import EqualizationFinding, OutlierFinding
from qinsight.examples import example


def test_encoder_with_sequence_inputs() -> None:
    # torch observes axis 1 (the sequence) and, with seq 16 and 64 features, fails its
    # divisibility assertion (PEER.md (c) 12).
    chosen = example("encoder")
    model, data = chosen.model(), chosen.data(6)
    with pytest.raises(AssertionError, match="divisible"):
        torch_model_report(prepared_fx(model, data[0]), data, {TorchEqualization(0.5)})
    report = qinsight.diagnose(model, data)
    assert not report.failures
    for finding in report.result("qinsight.equalization").findings:
        assert isinstance(finding, EqualizationFinding)
        site = next(s for s in report.sites if s.fqn == finding.fqn)
        in_features = model.get_submodule(site.fqn).in_features
        assert len(finding.input_ranges) == len(finding.scores) == in_features  # features, not sequence
    for finding in report.result("qinsight.outliers").findings:
        assert (
            isinstance(finding, OutlierFinding)
            and len(finding.statuses) == model.get_submodule(finding.fqn).in_features
        )


class AttentionModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        attended, _ = self.attention(h, h, h)
        out: torch.Tensor = self.head(attended.mean(dim=1))
        return out


def test_multihead_attention_model() -> None:
    # torch's pre-observer receives (q, k, v) and calibration crashes with a TypeError (PEER.md (c) 13).
    torch.manual_seed(0)
    model, data = AttentionModel().eval(), gaussian_batches((4, 10, 16), 4)
    with pytest.raises(TypeError, match="positional argument"):
        torch_model_report(prepared_fx(model, data[0]), data, {TorchOutlier()})
    report = qinsight.diagnose(model, data)
    # attention's projections run inside F.multi_head_attention_forward
    assert [s.fqn for s in report.sites if s.kind.is_layer] == ["embed", "head"]
    assert {r.detector for r in report.results} == {
        "qinsight.per_channel",
        "qinsight.dynamic_static",
        "qinsight.equalization",
        "qinsight.outliers",
        "qinsight.precision",
        "qinsight.range_conflict",
    }
    assert not report.failures
