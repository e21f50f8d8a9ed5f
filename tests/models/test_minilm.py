"""Real all-MiniLM-L6-v2 weights on real sentences: what breaks it under int8, found layer by layer."""

from __future__ import annotations

import copy

import pytest
import torch
from _data import sentence_batches
from _real import minilm_or_skip
from torch import nn
from torch.ao.quantization import QConfigMapping, get_default_qconfig, get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight

pytestmark = pytest.mark.slow  # real weights, or processes of their own: the whole suite's tier

LAYER0 = "bert.encoder.layer.0"


class Quantized:
    """MiniLM quantized two ways on 32 sentences, compared with the float model on 16 others."""

    def __init__(self) -> None:
        self.model = minilm_or_skip()
        batches = sentence_batches()
        self.calibration, self.held_out = batches[:4], batches[4:]
        # Everything x86 quantizes by default (embeddings need float qparams: left float).
        self.full = self.quantize(get_default_qconfig_mapping("x86").set_object_type(nn.Embedding, None))
        self.linear_only = self.quantize(QConfigMapping().set_object_type(nn.Linear, get_default_qconfig("x86")))
        self.full_cmp = qinsight.compare_activations(self.model, self.full, self.held_out)
        self.linear_cmp = qinsight.compare_activations(self.model, self.linear_only, self.held_out)

    def quantize(self, mapping: QConfigMapping) -> nn.Module:
        first = self.calibration[0]
        prepared = prepare_fx(copy.deepcopy(self.model), mapping, (first["input_ids"], first["attention_mask"]))
        with torch.no_grad():
            for batch in self.calibration:
                prepared(**batch)
        return convert_fx(prepared)

    def cosine(self, quantized: nn.Module) -> float:
        """Mean cosine similarity of int8 and fp32 sentence embeddings on the held-out sentences."""
        with torch.no_grad():
            return float(torch.cat([(self.model(**b) * quantized(**b)).sum(-1) for b in self.held_out]).mean())


@pytest.fixture(scope="module")
def minilm() -> Quantized:
    return Quantized()


def test_the_float_model_embeds_paraphrases_together(minilm: Quantized) -> None:
    with torch.no_grad():
        embeddings = minilm.model(**minilm.calibration[0])  # sentences 0/1, 2/3, 4/5 are paraphrases
    similarity = embeddings @ embeddings.t()
    for a, b in ((0, 1), (2, 3), (4, 5)):
        assert similarity[a, b] > 0.5
        assert similarity[a, (b + 2) % 6] < 0.2


def test_default_int8_breaks_minilm_and_linear_only_does_not(minilm: Quantized) -> None:
    assert minilm.cosine(minilm.full) < 0.4  # measured 0.21
    assert minilm.cosine(minilm.linear_only) > 0.8  # measured 0.86
    assert len(minilm.full_cmp.layers) == len(minilm.linear_cmp.layers) == 36  # 6 Linears in each of 6 layers


def test_the_attention_path_is_what_breaks_it(minilm: Quantized) -> None:
    # Layer 0's attention output projection computes well from float inputs (local ~21 dB),
    # but what reaches it through the quantized softmax over the -1e4 padding mask and the
    # quantized matmuls has lost the signal: the propagated SQNR is near 0 dB. Quantizing
    # only the Linears keeps it.
    projection = f"{LAYER0}.attention.output.dense"
    full, linear = minilm.full_cmp.layer(projection), minilm.linear_cmp.layer(projection)
    assert full.metric("sqnr", local=True) > 15.0
    assert full.metric("sqnr") < 5.0
    assert full.error_ratio > 5.0  # error amplified on the way in, not made here
    assert linear.metric("sqnr") > 15.0
    # query/key/value just before it are fine in both: the damage is between them and the projection.
    for name in ("query", "key", "value"):
        assert minilm.full_cmp.layer(f"{LAYER0}.attention.self.{name}").metric("sqnr") > 10.0


def test_the_quantized_embedding_sum_costs_the_first_layer_8db(minilm: Quantized) -> None:
    # With everything quantized, the first Linear's input already carries the error of the
    # quantized embedding adds and LayerNorm: propagated is well below local. With only the
    # Linears quantized it arrives exact: propagated equals local.
    query = f"{LAYER0}.attention.self.query"
    full, linear = minilm.full_cmp.layer(query), minilm.linear_cmp.layer(query)
    assert full.metric("sqnr") < full.metric("sqnr", local=True) - 5.0
    assert linear.metric("sqnr") == pytest.approx(linear.metric("sqnr", local=True), abs=1e-6)


def test_the_layers_that_make_the_most_error_are_the_ffn_outputs(minilm: Quantized) -> None:
    # The FFN's second Linear reads GELU outputs with BERT's outlier features: under a per-tensor
    # activation scale it makes the most error of any layer (12-19 dB local), in both configs.
    for comparison in (minilm.full_cmp, minilm.linear_cmp):
        worst = [layer.fqn for layer in comparison.worst(count=4, ops=False)]
        assert all(fqn.endswith(".output.dense") and ".attention." not in fqn for fqn in worst), worst
        assert comparison.worst(count=1, ops=False)[0].metric("sqnr", local=True) < 15.0


def test_the_outlier_detector_flags_the_layers_the_comparison_finds_worst(minilm: Quantized) -> None:
    report = qinsight.diagnose(minilm.model, minilm.calibration, model_name="minilm", verify=False)  # the flags: speed
    flagged = {f.fqn for f in report.result("qinsight.outliers").findings if f.verdict == "outlier channels"}
    worst = [layer.fqn for layer in minilm.full_cmp.worst(count=4, ops=False)]
    assert set(worst) <= flagged, (worst, sorted(flagged))
