"""compare_weights and metrics: differential against Numeric Suite FX, BN folding, defined edge values."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.ao.ns._numeric_suite_fx as ns
from _checks import HostReads, examples
from _data import gaussian_batches
from _models import MLP, ConvBnReluCNN, TwiceLinear, seeded
from _peers import quantized_fx
from _real import mobilenet_v2_or_skip
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.ao.ns.fx.utils import compute_sqnr
from torch.ao.quantization import (
    QConfigMapping,
    default_dynamic_qconfig,
    get_default_qconfig,
)

import qinsight
from qinsight.compare import accumulate
from qinsight.compare import metric_functions as metrics
from qinsight.compare.weights import compare_weights, fold_batchnorm
from qinsight.core.errors import PluginLoadError
from qinsight.plugin.testing import write_distribution


def test_metric_edge_values() -> None:
    x = torch.tensor([1.0, -2.0, 3.0])
    zero = torch.zeros(3)
    assert (metrics.sqnr(x, x), metrics.relative_l2(x, x), metrics.cosine(x, x)) == (math.inf, 0.0, pytest.approx(1.0))
    assert (metrics.sqnr(zero, x), metrics.relative_l2(zero, x), metrics.cosine(zero, x)) == (-math.inf, math.inf, 0.0)
    assert (metrics.sqnr(zero, zero), metrics.relative_l2(zero, zero), metrics.cosine(zero, zero)) == (
        math.inf,
        0.0,
        1.0,
    )
    assert math.isnan(compute_sqnr(zero, zero).item())  # torch's: nan where ours is defined
    assert metrics.max_abs_error(x, x + torch.tensor([0.0, 0.5, -0.25])) == 0.5
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(4,\)"):
        metrics.mse(x, torch.zeros(4))


def test_sqnr_agrees_with_torch_where_both_are_defined() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        x = torch.randn(64, 32, generator=g)
        y = x + 0.01 * torch.randn(64, 32, generator=g)
        assert metrics.sqnr(x, y) == pytest.approx(compute_sqnr(x, y).item(), abs=1e-3)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_weight_sqnr_matches_numeric_suite_fx(name: str) -> None:
    model = seeded(MLP()) if name == "mlp" else seeded(ConvBnReluCNN())
    data = gaussian_batches((8, 16) if name == "mlp" else (4, 3, 16, 16), 6)
    prepared, converted = quantized_fx(model, data)
    results = ns.extract_weights("fp32", prepared, "int8", converted)
    ns.extend_logger_results_with_comparison(results, "fp32", "int8", compute_sqnr, "sqnr")
    theirs = {v["weight"]["int8"][0]["fqn"]: v["weight"]["int8"][0]["sqnr"][0].item() for v in results.values()}
    ours = compare_weights(model, converted)
    assert {layer.fqn for layer in ours.layers} == set(theirs)
    for layer in ours.layers:
        assert layer.metric("sqnr") == pytest.approx(theirs[layer.fqn], abs=0.1)
        assert len(layer.per_channel[0].values) == model.get_submodule(layer.fqn).weight.shape[0]
    if name == "cnn":
        conv1 = ours.layer("conv1")
        assert conv1.folded_bn == "bn1" and conv1.quantized_type.endswith("quantized.modules.conv_relu.ConvReLU2d")
        # Without folding, the comparison measures the fold, not quantization.
        unfolded = metrics.sqnr(model.conv1.weight, converted.conv1.weight().dequantize())
        assert unfolded < conv1.metric("sqnr") - 10
        assert torch.allclose(
            fold_batchnorm(model.conv1.weight.detach(), model.bn1), prepared.conv1[0].weight.detach(), atol=1e-6
        )


def test_dynamic_modules_and_worst_layers() -> None:
    model, data = seeded(MLP()), gaussian_batches((8, 16), 3)
    _, converted = quantized_fx(model, data, QConfigMapping().set_global(default_dynamic_qconfig))
    comparison = compare_weights(model, converted, metrics=["sqnr", "cosine"])
    assert all(".dynamic." in layer.quantized_type for layer in comparison.layers)
    worst = comparison.worst("sqnr", count=2)
    assert [w.metric("sqnr") for w in worst] == sorted(layer.metric("sqnr") for layer in comparison.layers)[:2]
    assert [m.name for m in comparison.layers[0].metrics] == ["sqnr", "cosine"]


@pytest.mark.slow
def test_real_mobilenet_v2_per_tensor_weights_hurt_depthwise_convs_most() -> None:
    model = mobilenet_v2_or_skip()
    data = gaussian_batches((2, 3, 224, 224), 2)
    per_tensor = QConfigMapping().set_global(get_default_qconfig("qnnpack"))  # per-tensor weights
    _, converted = quantized_fx(model, data, per_tensor)
    comparison = compare_weights(model, converted, metrics=["sqnr"])
    groups = {fqn: m.groups for fqn, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    # measured: the 3 worst are depthwise (31.2-32.3 dB); medians 35.9 dB depthwise vs 38.3 dB for the rest
    assert all(groups.get(layer.fqn, 1) > 1 for layer in comparison.worst("sqnr", count=3))
    depthwise = sorted(layer.metric("sqnr") for layer in comparison.layers if groups.get(layer.fqn, 1) > 1)
    others = sorted(layer.metric("sqnr") for layer in comparison.layers if groups.get(layer.fqn, 1) == 1)
    assert depthwise[len(depthwise) // 2] < others[len(others) // 2] - 1.5
    assert all(layer.folded_bn is not None for layer in comparison.layers if layer.kind == "conv2d")


def test_metric_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_distribution(
        tmp_path,
        "acme-metrics",
        {"acme_metrics": "def peak(x, y):\n    return float((x - y).abs().max() / x.abs().max())\n"},
        {},
    )
    (next(root.glob("*.dist-info")) / "entry_points.txt").write_text("[qinsight.metrics]\npeak = acme_metrics:peak\n")
    monkeypatch.syspath_prepend(str(root))
    peak = metrics.load_metric("peak")
    assert peak(torch.tensor([2.0, -4.0]), torch.tensor([2.0, -3.0])) == 0.25
    with pytest.raises(PluginLoadError, match="no such metric .*peak"):
        metrics.load_metric("nope")


def numeric_suite(
    prepared: nn.Module, converted: nn.Module, batch: torch.Tensor
) -> tuple[dict[str, float], dict[str, float]]:
    """Numeric Suite FX's per-layer SQNR: unshadowed (add_loggers) and shadowed (add_shadow_loggers)."""
    a, b = ns.add_loggers("fp32", copy.deepcopy(prepared), "int8", copy.deepcopy(converted), ns.OutputLogger)
    a(batch)
    b(batch)
    plain = ns.extract_logger_info(a, b, ns.OutputLogger, "int8")
    shadowed_model = ns.add_shadow_loggers(
        "fp32", copy.deepcopy(prepared), "int8", copy.deepcopy(converted), ns.OutputLogger
    )
    shadowed_model(batch)
    shadowed = ns.extract_shadow_logger_info(shadowed_model, ns.OutputLogger, "int8")
    out = []
    for results in (plain, shadowed):
        ns.extend_logger_results_with_comparison(results, "fp32", "int8", compute_sqnr, "sqnr")
        out.append(
            {
                v["node_output"]["int8"][0]["fqn"]: v["node_output"]["int8"][0]["sqnr"][0].item()
                for v in results.values()
            }
        )
    return out[0], out[1]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_activation_errors_against_numeric_suite_fx(name: str) -> None:
    model = seeded(MLP()) if name == "mlp" else seeded(ConvBnReluCNN())
    data = gaussian_batches((8, 16) if name == "mlp" else (4, 3, 16, 16), 6)
    prepared, converted = quantized_fx(model, data)
    plain, shadowed = numeric_suite(prepared, converted, data[0])
    ours = qinsight.compare_activations(model, converted, [data[0]])
    first = ours.layers[0]
    assert first.compared_at == "relu1"  # fused conv/linear + (BN) + ReLU: compared after the ReLU
    for layer in ours.layers:
        # propagated error = add_loggers, to 0.1 dB (measured: equal to 0.01 dB)
        assert layer.metric("sqnr") == pytest.approx(plain[layer.fqn], abs=0.1)
    # Documented difference: our local error feeds the quantized layer the *float* input, so input
    # quantization error is included and the first layer's local error equals its propagated error.
    # add_shadow_loggers feeds the *float* layer the quantized model's input, which leaves it out:
    assert first.metric("sqnr", local=True) == pytest.approx(first.metric("sqnr"), abs=1e-9)
    assert shadowed[first.fqn] > first.metric("sqnr", local=True) + 0.5
    layer_module = converted.get_submodule(first.fqn)
    scale, zero_point = (
        converted.get_buffer(f"{first.fqn.replace('.', '_')}_input_scale_0"),
        converted.get_buffer(f"{first.fqn.replace('.', '_')}_input_zero_point_0"),
    )
    q_in = torch.quantize_per_tensor(data[0], float(scale), int(zero_point), torch.quint8)
    float_layer = prepared.get_submodule(first.fqn)
    with torch.no_grad():
        reproduced = metrics.sqnr(float_layer(q_in.dequantize()), layer_module(q_in).dequantize())
    assert reproduced == pytest.approx(shadowed[first.fqn], abs=0.01)  # what add_shadow_loggers measures


def test_activation_comparison_many_batches_and_ratio() -> None:
    model, data = seeded(ConvBnReluCNN()), gaussian_batches((4, 3, 16, 16), 6)
    _, converted = quantized_fx(model, data)
    comparison = qinsight.compare_activations(model, converted, data, metrics=["sqnr", "relative_l2"])
    assert all(layer.batches == 6 for layer in comparison.layers)
    assert comparison.layer("conv1").error_ratio == pytest.approx(1.0)  # the first layer inherits no error
    fc = comparison.layer("fc")  # measured 0.98: upstream error can also partly cancel
    assert fc.error_ratio == pytest.approx(fc.metric("relative_l2") / fc.metric("relative_l2", local=True))
    worst = min(row.metric("sqnr") for row in comparison.layers)
    assert comparison.worst(local=False, count=1)[0].metric("sqnr") == worst


def test_a_layer_called_twice_is_compared_call_by_call() -> None:
    # A site is a call: a module called twice per forward has a row per call, each
    # against the quantized model's same call.
    model, data = seeded(TwiceLinear()), gaussian_batches((8, 8), 3)
    _, converted = quantized_fx(model, data)
    comparison = qinsight.compare_activations(model, converted, data, metrics=["sqnr"])
    assert [row.fqn for row in comparison.layers] == ["shared", "shared#1", "out"]
    floats: list[torch.Tensor] = []
    quants: list[torch.Tensor] = []
    hooks = [
        model.shared.register_forward_hook(lambda _m, _a, out: floats.append(out)),
        converted.get_submodule("shared").register_forward_hook(lambda _m, _a, out: quants.append(out.dequantize())),
    ]
    with torch.no_grad():
        for batch in data:
            model(batch)
            converted(batch)
    for hook in hooks:
        hook.remove()
    for call, name in enumerate(["shared", "shared#1"]):
        row = comparison.layer(name)
        assert row.batches == len(data) and row.compared_at == name
        pairs = list(zip(floats[call::2], quants[call::2]))
        signal = sum(float((f.double() ** 2).sum()) for f, _ in pairs)
        noise = sum(float(((f.double() - q.double()) ** 2).sum()) for f, q in pairs)
        assert row.metric("sqnr") == pytest.approx(10 * math.log10(signal / noise), abs=1e-4)


@settings(max_examples=examples(40), deadline=None)
@given(
    shape=st.sampled_from([(2, 3, 4, 5), (3, 7), (1, 8, 2, 2)]),
    channels_last=st.booleans(),
    scale=st.floats(1e-4, 10.0),
    zero_point=st.integers(0, 255),
    signed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_kept_outputs_dequantize_bit_identically(
    shape: tuple[int, ...], channels_last: bool, scale: float, zero_point: int, signed: bool, seed: int
) -> None:
    # Quantized outputs are kept as their integers (copied into reused buffers) and dequantized
    # into a reused buffer; the values must be exactly Tensor.dequantize's, in the same layout,
    # even when the buffers were sized by an earlier batch and the model's tensor is gone.
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    q = torch.quantize_per_tensor(
        x, scale, zero_point - 128 if signed else zero_point, torch.qint8 if signed else torch.quint8
    )
    expected = q.dequantize()
    kept = accumulate.KeptOutputs(copied=True)
    kept.keep("", "layer", torch.quantize_per_tensor(torch.ones(256), 1.0, 0, q.dtype))  # an earlier batch
    kept.new_batch()  # plans room for it
    kept.keep("", "layer", q)
    model_storage = q.untyped_storage().data_ptr()
    del q  # the model lets go of its output
    raw = kept.take("", "layer", 0)
    assert raw is not None and raw.scale is not None  # kept as integers, not as the tensor
    assert raw.values.untyped_storage().data_ptr() != model_storage  # copied into the planned block
    got = raw.tensor()
    assert torch.equal(got, expected) and got.stride() == expected.stride()
    assert kept.take("", "layer", 0) is None and kept.take("", "layer", 1) is None  # taken once; no second call


@settings(max_examples=examples(60), deadline=None)
@given(
    shape=st.sampled_from([(2, 3, 4, 5), (5, 7), (1, 8, 3, 3), (0, 4)]),
    channels_last=st.booleans(),
    quantized=st.booleans(),
    chunk=st.integers(1, 50),
    seed=st.integers(0, 2**16),
)
def test_chunked_sums_equal_whole_tensor_sums(
    shape: tuple[int, ...], channels_last: bool, quantized: bool, chunk: int, seed: int
) -> None:
    # The error sums run chunk by chunk in memory order (the reference laid out like the output);
    # whatever the chunk size, layout or output kind they equal float64 sums over the whole tensors.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    output = x + torch.randn(shape, generator=g) * 0.1
    if channels_last and x.dim() == 4:
        output = output.contiguous(memory_format=torch.channels_last)
    if quantized:
        output = torch.quantize_per_tensor(output, 0.05, 100, torch.quint8)
    y = output.dequantize() if quantized else output
    scratch = accumulate.Scratch(chunk=chunk)
    raw = accumulate.split_output(output)
    reference = accumulate.Reference(x, like=raw.values, scratch=scratch)
    sums = dict(zip(accumulate.SUMS, accumulate.chunk_sums(reference, raw, scratch).tolist()))
    error = x.double() - y.double()
    assert raw.scale is not None if quantized else raw.scale is None
    assert sums["err_sq"] == pytest.approx(float((error**2).sum()), rel=1e-5, abs=1e-9)
    assert sums["act_sq"] == pytest.approx(float((y.double() ** 2).sum()), rel=1e-5, abs=1e-9)
    assert sums["ref_sq"] == pytest.approx(float((x.double() ** 2).sum()), rel=1e-5, abs=1e-9)
    assert reference.sq is None if not error.numel() else float(reference.sq) == sums["ref_sq"]
    assert sums["max_abs"] == pytest.approx(float(error.abs().max()) if error.numel() else 0.0, rel=1e-5, abs=1e-6)


def test_the_error_sums_read_nothing_on_the_host_per_batch() -> None:
    # Each compared tensor's sums stay on the outputs' device until the comparison ends (on a GPU
    # nothing waits batch by batch): 2 batches or 6, the same reads, at most one per row and error kind.
    model = seeded(MLP())
    batches = gaussian_batches((8, 16), 6)
    _, quantized = quantized_fx(model, batches[:2])
    reads = []
    for count in (2, 6):
        with HostReads() as seen:
            comparison = qinsight.compare_activations(model, quantized, batches[:count])
        reads.append(len(seen.seen))
    assert reads[0] == reads[1] and 0 < reads[0] <= 2 * len(comparison.rows)


def test_qinsight_compare_traces_the_float_model_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # compare_weights and compare_activations share one reading of the float model's structure
    from qinsight.cli import main
    from qinsight.frontends import LeafTracer

    traced: list[str] = []
    trace = LeafTracer.trace

    def counting(self: LeafTracer, root: Any, *args: Any, **kwargs: Any) -> Any:
        traced.append(type(root).__name__)
        return trace(self, root, *args, **kwargs)

    monkeypatch.setattr(LeafTracer, "trace", counting)
    assert main(["compare", "--example", "cnn", "--batches", "2"]) == 0
    assert "Float vs quantized" in capsys.readouterr().out
    assert traced == ["SmallCNN"]
