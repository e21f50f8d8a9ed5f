"""compare_configs: several candidate configs in one pass, against torch's n-shadows, FX and PT2E together."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.ao.ns._numeric_suite_fx as ns
from _data import gaussian_batches
from _models import MLP, ConvBnReluCNN, seeded
from torch import nn
from torch.ao.ns.fx.qconfig_multi_mapping import QConfigMultiMapping
from torch.ao.quantization import QConfig, QConfigMapping, get_default_qconfig
from torch.ao.quantization.backend_config import get_native_backend_config
from torch.ao.quantization.observer import default_per_channel_weight_observer, default_weight_observer

import qinsight
from qinsight.core.errors import InvalidParameterError

# Same activations (x86's histogram observer), weights per tensor or per channel.
X86 = get_default_qconfig("x86")
PER_TENSOR = QConfig(activation=X86.activation, weight=default_weight_observer)
PER_CHANNEL = QConfig(activation=X86.activation, weight=default_per_channel_weight_observer)


def n_shadows_sqnr(model: nn.Module, data: list[torch.Tensor]) -> dict[str, list[float]]:
    """torch's prepare_n_shadows_model with [per-tensor, per-channel]: fqn -> mean SQNR per qconfig."""
    mapping = QConfigMultiMapping().set_global([PER_TENSOR, PER_CHANNEL])
    prepared = ns.prepare_n_shadows_model(copy.deepcopy(model), (data[0],), mapping, get_native_backend_config())
    for batch in data:
        prepared(batch)
    converted = ns.convert_n_shadows_model(prepared)
    ns.loggers_set_enabled(converted, True)  # convert leaves them off: nothing would be logged
    for batch in data:
        converted(batch)
    results = ns.extract_results_n_shadows_model(converted)["model"]["node_output"]
    table: dict[str, list[float]] = {}
    for subgraph in sorted(results):
        for entry in results[subgraph]:
            if entry["comparisons"] and entry["fqn"]:
                table.setdefault(entry["fqn"], []).append(float(torch.stack(entry["comparisons"]).mean()))
    return table


def test_local_sqnr_per_config_matches_n_shadows() -> None:
    model = seeded(ConvBnReluCNN())
    data = gaussian_batches((4, 3, 16, 16), 6)
    configs = {
        "per_tensor": QConfigMapping().set_global(PER_TENSOR),
        "per_channel": QConfigMapping().set_global(PER_CHANNEL),
    }
    ours = qinsight.compare_configs(model, configs, data)
    theirs = n_shadows_sqnr(model, data)
    assert ours.configs == ("per_tensor", "per_channel")
    assert [row.fqn for row in ours.rows] == ["conv1", "block.0", "fc"]
    for fqn in ("conv1", "block.0"):  # the same measurement: within 0.1 dB
        row = ours.row(fqn)
        for config, expected in zip(ours.configs, theirs[fqn]):
            assert row.score(config).metric("sqnr") == pytest.approx(expected, abs=0.1)
    # fc differs by design: its input arrives through pool and flatten, which keep block.0's
    # output scale. qinsight quantizes the float input with that scale, as the quantized model
    # does; torch's shadow observes the pooled values itself and gets a finer scale, an input
    # quantization the deployed model never uses. So torch's shadow shows less error.
    for config, expected in zip(ours.configs, theirs["fc"]):
        assert ours.row("fc").score(config).metric("sqnr") < expected - 1.0


def test_best_config_per_layer_follows_where_per_channel_matters() -> None:
    model = seeded(MLP())
    # Inputs come in equal pairs, and fc1's first output channel is 40 * (x0 - x1): zero in float,
    # but its weights of 40 set a per-tensor scale that rounds every other channel's weights
    # (std 0.3) to a few levels. Per-channel weights keep them.
    g = torch.Generator().manual_seed(0)
    data = [torch.randn(16, 8, generator=g).repeat_interleave(2, dim=1) for _ in range(6)]
    with torch.no_grad():
        model.fc1.weight[0] = 0.0
        model.fc1.weight[0, :2] = torch.tensor([40.0, -40.0])
    configs = {
        "per_tensor": QConfigMapping().set_global(PER_TENSOR),
        "per_channel": QConfigMapping().set_global(PER_CHANNEL),
    }
    table = qinsight.compare_configs(model, configs, data)
    fc1 = table.row("fc1")
    assert table.best()["fc1"] == fc1.best == "per_channel"
    assert fc1.score("per_channel").metric("sqnr") > fc1.score("per_tensor").metric("sqnr") + 10.0
    for row in table.rows:  # best is the argmax of local SQNR, whichever it is
        assert row.best == max(row.scores, key=lambda s: s.metric("sqnr")).config
    by_error = qinsight.compare_configs(model, configs, data, rank_by="relative_l2")
    for row in by_error.rows:  # an error metric ranks lowest-first
        assert row.best == min(row.scores, key=lambda s: s.metric("relative_l2")).config


def test_a_config_that_leaves_a_layer_float_scores_only_what_it_quantizes() -> None:
    model = seeded(MLP())
    data = gaussian_batches((16, 16), 4)
    skip_fc2 = QConfigMapping().set_global(PER_TENSOR).set_module_name("fc2", None)
    table = qinsight.compare_configs(
        model, {"all": QConfigMapping().set_global(PER_TENSOR), "skip_fc2": skip_fc2}, data
    )
    assert [s.config for s in table.row("fc2").scores] == ["all"]
    assert [s.config for s in table.row("fc1").scores] == ["all", "skip_fc2"]
    assert all(math.isfinite(s.metric("sqnr")) for row in table.rows for s in row.scores)


def test_fx_and_pt2e_candidates_side_by_side() -> None:
    xiq = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    model = seeded(ConvBnReluCNN())
    data = gaussian_batches((4, 3, 16, 16), 4)
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    table = qinsight.compare_configs(model, {"fx": QConfigMapping().set_global(PER_CHANNEL), "pt2e": quantizer}, data)
    conv = table.row("conv1")
    assert conv.score("pt2e").quantized_type == "aten.conv2d.default"
    assert "ConvReLU2d" in conv.score("fx").quantized_type
    # FX's x86 activations use 7 bits (reduce_range), X86InductorQuantizer 8: about 6 dB apart.
    assert conv.best == "pt2e"
    assert conv.score("pt2e").metric("sqnr") - conv.score("fx").metric("sqnr") == pytest.approx(6.0, abs=1.5)


def test_bad_arguments_are_named() -> None:
    model = seeded(MLP())
    data = gaussian_batches((16, 16), 2)
    configs = {"a": QConfigMapping().set_global(PER_TENSOR)}
    with pytest.raises(InvalidParameterError, match="rank_by"):
        qinsight.compare_configs(model, configs, data, rank_by="psnr")
    with pytest.raises(InvalidParameterError, match="iterator"):
        qinsight.compare_configs(model, configs, iter(data))
    with pytest.raises(
        InvalidParameterError, match="a QConfigMapping, a torchao Quantizer or a torchao quantize_ config"
    ):
        qinsight.compare_configs(model, {"a": "x86"}, data)
    with pytest.raises(InvalidParameterError, match="at least one config"):
        qinsight.compare_configs(model, {}, data)
