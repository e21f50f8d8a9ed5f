"""SmolLM2-135M, a decoder LLM with real weights, loaded by our own code and diagnosed end to end."""

from __future__ import annotations

import pytest
import torch
from _real import smollm2_or_skip
from torch import nn

import qinsight
from qinsight.detectors import OutlierFinding, PrecisionFinding
from qinsight.outputs.html import render_html
from qinsight.types import ActivationMode

pytestmark = pytest.mark.slow  # real weights, or processes of their own: the whole suite's tier


@pytest.fixture(scope="module")
def smollm2() -> nn.Module:
    return smollm2_or_skip()


@pytest.fixture(scope="module")
def report(smollm2: nn.Module) -> qinsight.Report:
    """Diagnosed once for the tests that read it (a minute on 2 cores, verification included)."""
    from qinsight.examples.smollm import token_batches

    return qinsight.diagnose(smollm2, token_batches(tokens=64)[:3], model_name="SmolLM2-135M")


def test_the_weights_and_tokenizer_load_right(smollm2: nn.Module) -> None:
    # llama.cpp stores q/k permuted for its rotary layout: a wrong un-permute still runs, but talks nonsense
    from qinsight.examples.smollm import tokenizer

    bpe = tokenizer()
    ids = torch.tensor([bpe.encode("The capital of France is").ids])
    with torch.no_grad():
        for _ in range(2):
            ids = torch.cat([ids, smollm2(ids)[0, -1].argmax().view(1, 1)], dim=1)
    assert bpe.decode(ids[0].tolist()) == "The capital of France is Paris."


def test_its_massive_activations_are_found(report: qinsight.Report) -> None:
    assert report.metadata.frontend == "fx" and sum(s.kind.is_layer for s in report.sites) == 30 * 7 + 1
    outliers = {f.fqn: f for f in report.result("qinsight.outliers").findings if isinstance(f, OutlierFinding)}
    # layer 11's down_proj writes residual channel 507 (~23,000 from there on), layer 28's cancels it:
    # their inputs are the largest of all down_proj inputs, in the thousands
    by_size = sorted((f for fqn, f in outliers.items() if fqn.endswith("down_proj")), key=lambda f: -f.max_abs)
    assert [f.fqn for f in by_size[:2]] == ["layers.11.mlp.down_proj", "layers.28.mlp.down_proj"]
    assert by_size[1].max_abs > 1000 > 2 * by_size[2].max_abs
    assert all(f.verdict == "outlier channels" and f.magnitude_channels for f in by_size[:2])
    # what LLM methods read: the same two have the heaviest tails of all down_proj inputs (kurtosis
    # measured 4.7e4 and 5.5e4, next 2.9e4 at layer 9; a Gaussian's is 3), values past LLM.int8()'s 6,
    # and massive tokens (layer 28: every token, peaking in channels 1095 and 678)
    by_kurtosis = sorted(
        (f for fqn, f in outliers.items() if fqn.endswith("down_proj")), key=lambda f: -(f.kurtosis or 0.0)
    )
    assert {f.fqn for f in by_kurtosis[:2]} == {"layers.11.mlp.down_proj", "layers.28.mlp.down_proj"}
    for finding in by_kurtosis[:2]:
        assert finding.tails is not None and len(finding.tails.mean_abs()) == 1536
        assert (finding.kurtosis or 0.0) > 40_000
        assert finding.int8_outlier_channels and finding.tails.massive_tokens and finding.massive_channels
        assert "massive tokens" in finding.reason() and "kurtosis" in finding.reason()
    last = outliers["layers.28.mlp.down_proj"].tails
    assert last is not None and last.massive_tokens == last.tokens and last.massive_channels()[:2] == (1095, 678)
    text = qinsight.to_text(report)
    assert "SmolLM2-135M (fx frontend, backend x86, 3 calibration batches, 211 quantizable modules, 545 ops" in text
    assert "  keep in float (" in text and "channel 507" in text  # the ops kept float, by role; their findings say why


def test_its_massive_activations_lead_to_suggestions(report: qinsight.Report) -> None:
    precision = {f.fqn: f for f in report.result("qinsight.precision").findings if isinstance(f, PrecisionFinding)}
    # the two outlier down_proj inputs: thousands wide, their median channel under one: dynamic activations
    for fqn in ("layers.11.mlp.down_proj", "layers.28.mlp.down_proj"):
        finding, suggestion = precision[fqn], report.suggestion(fqn)
        assert finding.verdict == "too few bits" and finding.worst is not None and finding.worst.tensor_range > 1000
        # of 1536, most span less than one step (8 bits, qinsight's FX config: 1445 at layer 28; 1534 at torch's 7)
        assert finding.worst.collapsed_channels > 1400
        assert suggestion is not None and suggestion.activation is ActivationMode.DYNAMIC
    # the residual stream from layer 11 on: channel 507 spans it, every residual add is kept in float
    residual = [f for fqn, f in precision.items() if fqn.startswith(tuple(f"layers.{i}.add#" for i in range(12, 28)))]
    assert len(residual) == 32
    for finding in residual:
        assert finding.verdict == "too few bits" and finding.worst is not None
        assert 507 in {side.widest_channel for side in finding.sides}
        assert finding.worst.tensor_range > 10_000  # measured ~23,000 once layer 11 has written channel 507
        # so most other channels are narrower than one step of that scale: measured 321-471 of 576 at
        # 8 bits, qinsight's FX config (545-558 at torch's 7)
        assert finding.worst.collapsed_channels > 0.5 * finding.worst.channels == 0.5 * 576
        suggestion = report.suggestion(finding.fqn)
        assert suggestion is not None and suggestion.keep_float
    page = render_html(report)
    assert "layers.12.add#0" in page and "too few bits" in page
