"""The metric contract: each metric says which way is better, and worst-first orders follow it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import attrs
import pytest
import torch
from _data import gaussian_batches
from _models import ConvBnReluCNN, seeded
from _peers import quantized_fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.ao.quantization import QConfig, QConfigMapping, get_default_qconfig
from torch.ao.quantization.observer import default_weight_observer

import qinsight
from qinsight.compare import metric_functions as metrics
from qinsight.core.comparison import MetricValue
from qinsight.outputs.serde import report_from_json, report_to_dict
from qinsight.plugin import ErrorTotals, Metric
from qinsight.plugin.testing import write_distribution


@pytest.fixture(scope="module")
def cnn() -> tuple[torch.nn.Module, torch.nn.Module, list[torch.Tensor]]:
    model = seeded(ConvBnReluCNN())
    data = gaussian_batches((4, 3, 16, 16), 3)
    _, quantized = quantized_fx(model, data)
    return model, quantized, data


def test_worst_follows_each_metrics_direction(cnn: tuple[torch.nn.Module, torch.nn.Module, list[torch.Tensor]]) -> None:
    model, quantized, data = cnn
    acts = qinsight.compare_activations(model, quantized, data)
    by_l2 = [layer.metric("relative_l2", local=True) for layer in acts.worst("relative_l2", count=None)]
    by_sqnr = [layer.metric("sqnr", local=True) for layer in acts.worst("sqnr", count=None)]
    assert by_l2 == sorted(by_l2, reverse=True)  # an error: the worst is the largest
    assert by_sqnr == sorted(by_sqnr)  # higher is better: the worst is the smallest
    # both name the same worst layer, since relative L2 and SQNR measure the same error
    assert acts.worst("relative_l2", count=1) == acts.worst("sqnr", count=1)
    weights = qinsight.compare_weights(model, quantized)
    mse = [layer.metric("mse") for layer in weights.worst("mse", count=None)]
    assert mse == sorted(mse, reverse=True) and mse[0] > mse[-1]


def test_values_carry_their_direction(cnn: tuple[torch.nn.Module, torch.nn.Module, list[torch.Tensor]]) -> None:
    model, quantized, data = cnn
    layer = qinsight.compare_activations(model, quantized, data).layers[0]
    directions = {value.name: value.higher_is_better for value in layer.local}
    assert directions == {name: metrics.BUILTIN[name].higher_is_better for name in metrics.DEFAULT}
    assert directions["sqnr"] and directions["cosine"] and not directions["relative_l2"]


def test_every_metric_of_the_one_table_is_computed_with_its_direction() -> None:
    from qinsight.core.metrics import METRICS

    assert set(metrics.BUILTIN) == set(METRICS)
    assert all(metrics.BUILTIN[name].higher_is_better == spec.higher_is_better for name, spec in METRICS.items())
    x = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert metrics.top1(x, x.flip(1)) == 0.0 and metrics.top1(x, x * 2) == 1.0
    assert metrics.cosine(x, x * 3) == pytest.approx(1.0) and METRICS["cosine"].admits(metrics.cosine(x, -x))


def test_built_in_totals_forms_match_their_tensor_forms() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g)
    y = x + 0.05 * torch.randn(1000, generator=g)
    e = (x - y).double()
    totals = ErrorTotals(
        ref_sq=float((x.double() ** 2).sum()),
        act_sq=float((y.double() ** 2).sum()),
        err_sq=float((e**2).sum()),
        max_abs=float(e.abs().max()),
        count=1000,
        batches=1,
    )
    for metric in (metrics.BUILTIN[name] for name in metrics.DEFAULT):  # top1 counts rows: no totals form
        assert metric.from_totals is not None
        assert metric.from_totals(totals) == pytest.approx(metric.on_tensors(x, y), rel=1e-9), metric.name


def install_metrics(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: str, source: str, entries: str) -> None:
    """A distribution of metric plugins in ``module`` (a name of its own per test: modules stay imported)."""
    root = write_distribution(tmp_path, module.replace("_", "-"), {module: source}, {})
    (next(root.glob("*.dist-info")) / "entry_points.txt").write_text(f"[qinsight.metrics]\n{entries}")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, module, raising=False)


AGREEMENT = """
from qinsight.plugin import Metric

def _agreement(x, y):
    return float(((x - y).abs() < 0.05).double().mean())

agreement = Metric(name="agreement", higher_is_better=True, on_tensors=_agreement)
misnamed = Metric(name="other", higher_is_better=True, on_tensors=_agreement)
"""


def test_a_plugin_metric_says_higher_is_better_and_ranking_follows(
    cnn: tuple[torch.nn.Module, torch.nn.Module, list[torch.Tensor]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_metrics(monkeypatch, tmp_path, "acme_agreement", AGREEMENT, "agreement = acme_agreement:agreement\n")
    model, _, data = cnn
    x86 = get_default_qconfig("x86")
    configs = {
        "x86": QConfigMapping().set_global(x86),
        "per_tensor": QConfigMapping().set_global(QConfig(activation=x86.activation, weight=default_weight_observer)),
    }
    table = qinsight.compare_configs(model, configs, data, metrics=["agreement", "relative_l2"], rank_by="agreement")
    for row in table.rows:
        scores = {score.config: score.metric("agreement") for score in row.scores}
        assert scores[row.best] == max(scores.values())  # higher is better: the best config has the most agreement
        assert all(score.metric_value("agreement").higher_is_better for score in row.scores)
    by_error = qinsight.compare_configs(
        model, configs, data, metrics=["agreement", "relative_l2"], rank_by="relative_l2"
    )
    for row in by_error.rows:
        errors = {score.config: score.metric("relative_l2") for score in row.scores}
        assert errors[row.best] == min(errors.values())


def test_plugin_metric_load_errors_name_the_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_metrics(monkeypatch, tmp_path, "acme_misnamed", AGREEMENT, "misnamed = acme_misnamed:misnamed\n")
    with pytest.raises(
        qinsight.errors.PluginLoadError, match="failed to load metric misnamed .*registered as 'misnamed'"
    ) as info:
        metrics.load_metric("misnamed")
    assert info.value.kind == "metric" and info.value.name == "misnamed"


def test_files_before_directions_were_stored_read_the_old_rule() -> None:
    layers = tuple(
        qinsight.types.LayerActivationComparison(
            fqn=f"fc{i}",
            kind="linear",
            quantized_type="q",
            quantized=True,
            compared_at=f"fc{i}",
            batches=1,
            propagated=(
                MetricValue(name="sqnr", value=30.0 + i, higher_is_better=True),
                MetricValue(name="peak", value=0.1 * i, higher_is_better=False),
            ),
            local=(
                MetricValue(name="sqnr", value=30.0 + i, higher_is_better=True),
                MetricValue(name="peak", value=0.1 * i, higher_is_better=False),
            ),
        )
        for i in range(3)
    )
    report = qinsight.comparison_report(qinsight.Comparison(activations=qinsight.ActivationComparison(layers=layers)))
    data = report_to_dict(report)
    data["schema_version"] = [1, 2]
    for layer in data["comparison"]["activations"]["layers"]:
        for value in (*layer["propagated"], *layer["local"]):
            del value["higher_is_better"]
    loaded = report_from_json(json.dumps(data))
    assert loaded == report  # sqnr higher, every other metric an error, as before 1.3
    assert loaded.comparison is not None and loaded.comparison.activations is not None
    assert [layer.fqn for layer in loaded.comparison.activations.worst("peak")] == ["fc2", "fc1", "fc0"]


def test_a_bare_callable_still_loads_as_an_error_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = "def spread(x, y):\n    return float((x - y).std())\n"
    install_metrics(monkeypatch, tmp_path, "acme_spread", source, "spread = acme_spread:spread\n")
    metric = metrics.load_metric("spread")
    assert isinstance(metric, Metric) and metric.name == "spread"
    assert not metric.higher_is_better and metric.from_totals is None
    assert attrs.evolve(MetricValue(name="spread", value=1.0), value=2.0).goodness == -2.0
    assert math.isinf(MetricValue(name="sqnr", value=math.inf).goodness)


@settings(max_examples=60, deadline=None)
@given(
    positions=st.integers(1, 12),
    vocabulary=st.integers(2, 40),
    noise=st.floats(0.0, 3.0),
    shift=st.floats(-50.0, 50.0),
    seed=st.integers(0, 2**16),
)
def test_language_model_metrics_read_the_last_dimension(
    positions: int, vocabulary: int, noise: float, shift: float, seed: int
) -> None:
    # kl: torch's kl_div of the two log-softmaxes over the vocabulary, averaged over positions; never
    # negative, 0 where the logits differ by a constant (the same distribution). token_agreement: the
    # share of positions whose argmax agrees.
    g = torch.Generator().manual_seed(seed)
    reference = torch.randn(positions, 3, vocabulary, generator=g) * 4
    actual = reference + noise * torch.randn(reference.shape, generator=g)
    p_log, q_log = (torch.log_softmax(t.double().reshape(-1, vocabulary), dim=1) for t in (reference, actual))
    expected = float(torch.nn.functional.kl_div(q_log, p_log, log_target=True, reduction="sum")) / (positions * 3)
    assert metrics.kl(reference, actual) == pytest.approx(max(expected, 0.0), rel=1e-9, abs=1e-12)
    assert metrics.kl(reference, reference + shift) == pytest.approx(0.0, abs=1e-9)
    agreeing = (reference.argmax(-1) == actual.argmax(-1)).double().mean().item()
    assert metrics.token_agreement(reference, actual) == agreeing
    assert metrics.token_agreement(reference, reference + shift) == 1.0
