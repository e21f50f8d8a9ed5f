"""SmolLM2-135M as Hugging Face ``transformers`` loads it (``LlamaForCausalLM`` from the packaged GGUF,
offline): diagnosed, and compared with its ``quantize_``d versions layer by layer, every quantized Linear
named with its format."""

from __future__ import annotations

import copy

import pytest
import torch
from _real import smollm2_hf_or_skip
from torch import nn

import qinsight
from qinsight.detectors import OutlierFinding
from qinsight.examples.smollm import TEXTS, token_batches

pytestmark = pytest.mark.slow
torchao_quantization = pytest.importorskip("torchao.quantization")


@pytest.fixture(scope="module")
def hf() -> nn.Module:
    return smollm2_hf_or_skip()


def test_transformers_reads_the_same_model_as_the_plain_torch_loader(hf: nn.Module) -> None:
    from qinsight.examples.smollm import load_smollm2

    tokens = token_batches(TEXTS)[0]
    with torch.no_grad():
        assert torch.equal(hf(tokens).logits, load_smollm2()(tokens))


@pytest.mark.extended(1)  # the same findings as our own loader's (tests/models/test_smollm.py), named as HF names them
def test_its_massive_activations_are_found_under_transformers_names(hf: nn.Module) -> None:
    # verify=False (speed): the findings alone; tests/cli's --hf test verifies it in PT2E (minutes)
    report = qinsight.diagnose(hf, token_batches(TEXTS)[:2], model_name="SmolLM2-135M (transformers)", verify=False)
    assert sum(s.kind.is_layer for s in report.sites) == 30 * 7 + 1
    assert report.metadata.frontend == "eager"  # transformers' Llama does not trace with torch.fx
    outliers = [f for f in report.result("qinsight.outliers").findings if isinstance(f, OutlierFinding)]
    # layer 11's down_proj writes the massive residual channel, layer 28's cancels it: the largest inputs
    by_size = sorted((f for f in outliers if f.fqn.endswith("down_proj")), key=lambda f: -f.max_abs)
    assert [f.fqn for f in by_size[:2]] == ["model.layers.11.mlp.down_proj", "model.layers.28.mlp.down_proj"]
    assert all(f.verdict == "outlier channels" for f in by_size[:2])


@pytest.mark.extended(1)  # quantize_ in three formats of a 135M LLM; MiniLM's quantize_ comparison runs in CI
def test_a_mixed_quantize_d_llama_is_compared_layer_by_layer_with_each_format(hf: nn.Module) -> None:
    linears = [name for name, module in hf.named_modules() if isinstance(module, nn.Linear) and name != "lm_head"]
    assignment = {name: ("int4_g32" if ".mlp." in name else "int8") for name in linears}
    quantized = copy.deepcopy(hf)
    torchao_quantization.quantize_(quantized, qinsight.fqn_to_config(assignment), filter_fn=None)
    batches = token_batches(TEXTS)[:2]
    activations = qinsight.compare_activations(hf, quantized, batches)
    weights = qinsight.compare_weights(hf, quantized)
    described = {"int8": "int8 weight-only, per row", "int4_g32": "int4 weight-only, groups of 32"}
    rows = {row.fqn: row for row in activations.layers}
    assert {fqn for fqn, row in rows.items() if row.quantized} == set(linears)  # 210: every one but the tied head
    for fqn, name in assignment.items():
        assert described[name] in rows[fqn].quantized_type and described[name] in weights.layer(fqn).quantized_type
        assert rows[fqn].local is not None and rows[fqn].propagated is not None
    # group-wise int4 loses about 4 bits' worth (24 dB) of the weights that int8 keeps
    mlp = [weights.layer(f).metric("sqnr") for f in linears if ".mlp." in f]
    attention = [weights.layer(f).metric("sqnr") for f in linears if ".self_attn." in f]
    assert max(mlp) < min(attention) - 12
