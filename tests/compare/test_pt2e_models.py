"""Float vs quantized on PyTorch 2 export quantization (convert_pt2e), against the FX flow and torchao's debugger."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import pytest
import torch
from _data import gaussian_batches
from _models import conv_bn_model
from _peers import pt2e_quantized, quantized_fx
from torch import nn
from torch.ao.quantization import QConfig, QConfigMapping
from torch.ao.quantization.observer import HistogramObserver, default_per_channel_weight_observer

import qinsight
from qinsight.pipeline.saturation import quantized_engine

xiq = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
from torchao.quantization.pt2e import _numeric_debugger as torchao_debugger  # noqa: E402

# What X86InductorQuantizer does, in FX terms: 8-bit histogram-calibrated activations
# (no reduce_range, unlike FX's x86 default) and symmetric per-channel int8 weights.
FX_LIKE_X86_INDUCTOR = QConfigMapping().set_global(
    QConfig(activation=HistogramObserver.with_args(reduce_range=False), weight=default_per_channel_weight_observer)
)


def fx_quantized(model: nn.Module, calibration: list[torch.Tensor]) -> nn.Module:
    return quantized_fx(model, calibration, FX_LIKE_X86_INDUCTOR)[1]


@contextlib.contextmanager
def onednn_kernels() -> Iterator[None]:
    """FX's quantized kernels from oneDNN, the library X86InductorQuantizer's graphs lower to.

    On CPUs without VNNI (AVX2 only) fbgemm's int8 convs saturate their int16 pair sums for 8-bit
    activations (no reduce_range) on every conv, not only depthwise ones: FX measured 25 dB where
    PT2E's computation gives 37.5 dB. oneDNN computes the same convs exactly on every CPU, so the
    flows are compared on the same arithmetic. A model converted here is packed for oneDNN and runs
    under it.
    """
    with quantized_engine("onednn"):
        yield


@pytest.fixture
def onednn() -> Iterator[None]:
    with onednn_kernels():
        yield


class Flows(NamedTuple):
    model: nn.Module
    pt2e: torch.fx.GraphModule
    torchao_reference: nn.Module
    fx: nn.Module
    data: list[torch.Tensor]


@pytest.fixture(scope="module")
def flows() -> Flows:
    model = conv_bn_model()
    calibration = gaussian_batches((4, 3, 16, 16), 6, seed=1)
    pt2e, torchao_reference = pt2e_quantized(model, calibration)
    data = gaussian_batches((4, 3, 16, 16), 4, seed=2)
    with onednn_kernels():
        fx = fx_quantized(model, calibration)
    return Flows(model, pt2e, torchao_reference, fx, data)


@pytest.mark.usefixtures("onednn")
def test_pt2e_weights_match_the_fx_flow_with_batchnorm_folded(flows: Flows) -> None:
    model, pt2e, fx = flows.model, flows.pt2e, flows.fx
    ours, theirs = qinsight.compare_weights(model, pt2e), qinsight.compare_weights(model, fx)
    assert [layer.fqn for layer in ours.layers] == [layer.fqn for layer in theirs.layers] == ["conv1", "block.0", "fc"]
    assert [layer.folded_bn for layer in ours.layers] == ["bn1", "block.1", None]
    assert ours.layer("conv1").quantized_type == "aten.conv2d.default"
    for layer in ours.layers:  # the same per-channel int8 weights either way
        assert layer.metric("sqnr") == pytest.approx(theirs.layer(layer.fqn).metric("sqnr"), abs=0.01)
        assert layer.metric("sqnr") > 40.0


@pytest.mark.usefixtures("onednn")
def test_pt2e_activation_sqnr_within_1db_of_fx(flows: Flows) -> None:
    model, pt2e, fx, data = flows.model, flows.pt2e, flows.fx, flows.data
    code = pt2e.code
    ours, theirs = qinsight.compare_activations(model, pt2e, data), qinsight.compare_activations(model, fx, data)
    assert pt2e.code == code  # the taps are gone again
    assert [layer.compared_at for layer in ours.layers] == ["relu1", "block.2", "fc"]
    for fqn in ("conv1", "block.0"):  # conv + BN (+ ReLU): the same computation in both flows
        layer, other = ours.layer(fqn), theirs.layer(fqn)
        assert layer.batches == 4
        for local in (False, True):
            assert layer.metric("sqnr", local=local) == pytest.approx(other.metric("sqnr", local=local), abs=1.0)
    # The last Linear differs by design: X86InductorQuantizer leaves its output in float, FX
    # quantizes it, so FX's fc carries one more rounding.
    assert "quantize_per_tensor" not in str(next(iter(pt2e.graph.find_nodes(op="output"))).args)
    for local in (False, True):
        assert ours.layer("fc").metric("sqnr", local=local) > theirs.layer("fc").metric("sqnr", local=local)
    # The first layer's input is the model's input: local and propagated are the same run.
    first = ours.layer("conv1")
    assert first.metric("sqnr", local=True) == pytest.approx(first.metric("sqnr"), abs=1e-6)
    # Deeper, error from earlier layers adds up: propagated is below local.
    assert ours.layer("block.0").metric("sqnr") < ours.layer("block.0").metric("sqnr", local=True)


@pytest.mark.usefixtures("onednn")
def test_torchao_debugger_misreports_folded_convs(flows: Flows) -> None:
    # torchao's debugger compares the float conv *before* BatchNorm with the quantized conv that
    # absorbed it (PEER.md (f)), so it reports a few dB where the layer is at ~40 dB. qinsight
    # compares conv+BN+ReLU in float with the quantized conv+ReLU.
    model, pt2e, data, reference = flows.model, flows.pt2e, flows.data, flows.torchao_reference
    actual = torchao_debugger.prepare_for_propagation_comparison(pt2e)
    reference(data[0])
    actual(data[0])
    theirs = {
        info.name: float(summary.results[0].sqnr)
        for info, summary in torchao_debugger.compare_results(
            torchao_debugger.extract_results_from_loggers(reference),
            torchao_debugger.extract_results_from_loggers(actual),
        ).items()
    }
    ours = qinsight.compare_activations(model, pt2e, data[:1])
    for fqn, node in (("conv1", "conv2d"), ("block.0", "conv2d_1")):
        assert ours.layer(fqn).metric("sqnr") > 30.0
        assert theirs[node] < ours.layer(fqn).metric("sqnr") - 20.0, (node, theirs[node])
    # Where no BatchNorm sits in between, both measure the same thing.
    assert theirs["linear"] == pytest.approx(ours.layer("fc").metric("sqnr"), abs=0.1)


def test_pt2e_layers_reached_by_name_and_called_ops_only() -> None:
    model = conv_bn_model()
    calibration = gaussian_batches((4, 3, 16, 16), 3, seed=3)
    pt2e, _ = pt2e_quantized(model, calibration)
    comparison = qinsight.compare_activations(model, pt2e, calibration, metrics=["sqnr", "cosine"])
    assert [m.name for m in comparison.layer("fc").local] == ["sqnr", "cosine"]
    with pytest.raises(ValueError, match="no Linear/Conv"):
        qinsight.compare_activations(nn.Sequential(nn.Linear(3, 3)), pt2e, calibration)


@pytest.mark.slow
def test_real_mobilenet_v2_in_both_flows() -> None:
    from _real import mobilenet_v2_or_skip

    model = mobilenet_v2_or_skip()
    calibration, data = gaussian_batches((2, 3, 224, 224), 3, seed=1), gaussian_batches((2, 3, 224, 224), 2, seed=2)
    pt2e, _ = pt2e_quantized(model, calibration)
    ours = qinsight.compare_activations(model, pt2e, data)
    eight_bit = qinsight.compare_activations(model, fx_quantized(model, calibration), data)
    reduced = qinsight.compare_activations(model, quantized_fx(model, calibration)[1], data)
    assert len(ours.layers) == len(eight_bit.layers) == 53
    # PT2E quantizes after ReLU6 (hardtanh); FX fuses ReLU but not ReLU6, so it is compared at the BatchNorm.
    assert ours.layer("features.0.0").compared_at == "features.0.2"
    assert eight_bit.layer("features.0.0").compared_at == "features.0.1"
    # PT2E's reference graph computes in float after dequantizing: every layer is sound, and the
    # layers that make the most error are late projection convs (the linear bottleneck, no ReLU6).
    assert min(layer.metric("sqnr", local=True) for layer in ours.layers) > 25.0
    assert all(layer.fqn.endswith(".conv.2") for layer in ours.worst(count=4)), [w.fqn for w in ours.worst(count=4)]
    # The same 8-bit activations through FX's int8 kernels (fbgemm) saturate on depthwise convs:
    # local SQNR below 0 dB where PT2E has > 30. The x86 default's 7-bit activations (reduce_range) avoid it.
    depthwise = "features.3.conv.1.0"
    assert eight_bit.layer(depthwise).metric("sqnr", local=True) < 0.0
    assert ours.layer(depthwise).metric("sqnr", local=True) > 30.0
    assert reduced.layer(depthwise).metric("sqnr", local=True) > 15.0
    assert eight_bit.worst(count=1)[0].fqn in {
        n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.groups > 1
    }
