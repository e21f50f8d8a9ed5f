"""Models quantized by torchao's ``quantize_`` (tensor-subclass weights on plain modules), compared layer
by layer: every quantized Linear recognized with its format, its weights read as the kernels read them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from _data import sentence_batches
from _real import minilm_or_skip
from torch import nn

import qinsight

torchao_quantization = pytest.importorskip("torchao.quantization")


def _configs() -> dict[str, Any]:
    from torchao.quantization.granularity import PerGroup

    q = torchao_quantization
    return {
        "int8 weight-only, per row": q.Int8WeightOnlyConfig(),
        "int8 dynamic activations, int8 weights, per row": q.Int8DynamicActivationInt8WeightConfig(),
        "int4 weight-only, groups of 32": q.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    }


def _quantized(model: nn.Module, config: Any) -> nn.Module:
    quantized = copy.deepcopy(model)
    torchao_quantization.quantize_(quantized, config)
    return quantized


def test_every_quantize_d_linear_is_compared_with_its_format() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    batches = [torch.randn(16, 64) for _ in range(3)]
    weight_sqnr, output_sqnr = {}, {}
    for described, config in _configs().items():
        quantized = _quantized(model, config)
        activations = qinsight.compare_activations(model, quantized, batches)
        weights = qinsight.compare_weights(model, quantized)
        assert [row.fqn for row in activations.layers] == [row.fqn for row in weights.layers] == ["0", "2"]
        for row in (*activations.layers, *weights.layers):
            assert row.quantized and row.quantized_type.startswith(
                f"torch.nn.modules.linear.Linear: {described} (torchao "
            )
        weight_sqnr[described] = weights.layer("0").metric("sqnr")
        output_sqnr[described] = activations.layer("0").metric("sqnr")
    # what the formats lose, as measured: about 6 dB a bit of weight (48 dB at 8 bits, 24 at 4 in
    # groups of 32); quantizing the activations too costs the output more than the weights alone
    assert weight_sqnr["int8 weight-only, per row"] > weight_sqnr["int4 weight-only, groups of 32"] + 18
    assert output_sqnr["int8 dynamic activations, int8 weights, per row"] < output_sqnr["int8 weight-only, per row"] - 2


def test_the_weights_compared_are_the_ones_the_kernels_read() -> None:
    # The SQNR shown is that of the subclass's own dequantized weight against the float one, exactly.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32)).eval()
    for config in _configs().values():
        quantized = _quantized(model, config)
        row = qinsight.compare_weights(model, quantized).layer("0")
        float_weight, read = model[0].weight.detach().double(), quantized[0].weight.dequantize().double()
        expected = 20 * torch.log10(float_weight.norm() / (float_weight - read).norm()).item()
        assert row.metric("sqnr") == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow  # real MiniLM: the whole suite's tier (test_every_quantize_d_linear_is_compared_with_its_format)
def test_minilm_quantize_d_to_int8_dynamic_is_read_layer_by_layer() -> None:
    """Real all-MiniLM-L6-v2 weights: its 36 Linears, every one recognized as int8 dynamic."""
    model = minilm_or_skip()
    batches = sentence_batches(8)[:2]
    quantized = _quantized(model, torchao_quantization.Int8DynamicActivationInt8WeightConfig())
    comparison = qinsight.compare_activations(model, quantized, batches)
    linears = [row for row in comparison.layers if row.kind == "linear"]
    assert len(linears) == 36 and all(
        row.quantized and "int8 dynamic activations" in row.quantized_type for row in linears
    )
    assert min(row.metric("sqnr") for row in linears) > 10.0


def test_torchao_configs_are_candidates_of_compare_configs_in_torchaos_flow() -> None:
    """quantize_'s configs are the torchao flow's: compare_configs quantizes a copy with each and names
    each Linear's format, read from the quantized weights."""
    from qinsight.examples import example

    encoder = example("encoder")
    model, data = encoder.model(), encoder.data(3)
    configs = {
        "dynamic": torchao_quantization.Int8DynamicActivationInt8WeightConfig(),
        "weight-only": torchao_quantization.Int8WeightOnlyConfig(),
    }
    rows = qinsight.compare_configs(model, configs, data).rows
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    assert [row.fqn for row in rows] == linears
    for row in rows:
        described = {score.config: score.quantized_type for score in row.scores}
        assert "int8 dynamic activations, int8 weights, per row" in described["dynamic"]
        assert "int8 weight-only, per row" in described["weight-only"]


def test_an_int8_recipe_quantizes_what_it_names_and_a_static_linear_never_run_stays_float() -> None:
    from qinsight.compare.torchao_flow import Int8Layer, Int8Recipe, convert_torchao, prepare_torchao

    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(8, 8), "unused": nn.Linear(8, 8), "dynamic": nn.Linear(8, 4)})
    recipe = Int8Recipe(
        (
            Int8Layer("used", dynamic=False),
            Int8Layer("unused", dynamic=False),
            Int8Layer("dynamic", dynamic=True, per_channel=False),
        )
    )
    prepared = prepare_torchao(model, recipe)
    with torch.no_grad():
        prepared["dynamic"](prepared["used"](torch.randn(4, 8)))
    converted = convert_torchao(prepared)
    assert type(model["used"].weight) is nn.Parameter  # the user's model is not changed
    assert "int8 static activations" in qinsight.compare_weights(model, converted).layer("used").quantized_type
    assert type(converted["unused"].weight) is nn.Parameter  # no range to scale it with: float
    assert not converted["used"]._forward_pre_hooks  # the calibration's hooks are gone
    dynamic = converted["dynamic"].weight
    assert dynamic.scale.numel() == 1  # per-tensor weights, as the recipe says
