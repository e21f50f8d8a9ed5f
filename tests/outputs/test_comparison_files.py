"""Comparisons in report files: saved, loaded, shown as text, by `qinsight show`, and on the HTML page."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from _data import gaussian_batches
from _models import ConvBnReluCNN, seeded
from _peers import quantized_fx
from torch.ao.quantization import QConfig, QConfigMapping, get_default_qconfig
from torch.ao.quantization.observer import default_weight_observer

import qinsight
from qinsight.core.comparison import MetricValue
from qinsight.outputs.html import render_html
from qinsight.outputs.serde import report_from_json, report_to_dict

from _cli import run_cli


@pytest.fixture(scope="module")
def cnn_comparison() -> tuple[qinsight.Report, qinsight.Comparison]:
    model = seeded(ConvBnReluCNN())
    data = gaussian_batches((4, 3, 16, 16), 4)
    _, quantized = quantized_fx(model, data)
    x86 = get_default_qconfig("x86")
    configs = {
        "x86": QConfigMapping().set_global(x86),
        "per_tensor": QConfigMapping().set_global(QConfig(activation=x86.activation, weight=default_weight_observer)),
    }
    comparison = qinsight.Comparison(
        quantized="convert_fx, x86",
        weights=qinsight.compare_weights(model, quantized),
        activations=qinsight.compare_activations(model, quantized, data),
        configs=qinsight.compare_configs(model, configs, data),
    )
    return qinsight.diagnose(model, data, model_name="cnn").with_comparison(comparison), comparison


def test_a_report_carries_its_comparison_through_a_file(
    cnn_comparison: tuple[qinsight.Report, qinsight.Comparison], tmp_path: Path
) -> None:
    report, comparison = cnn_comparison
    path = tmp_path / "cnn.json"
    qinsight.save_report(report, path)
    loaded = qinsight.load_report(path)
    assert loaded == report and loaded.comparison == comparison
    assert loaded.comparison is not None and loaded.comparison.activations is not None
    # SQNR of an exact layer is inf: strict JSON holds it as a string and it comes back a float.
    assert json.loads(path.read_text())["comparison"]["configs"]["rank_by"] == "sqnr"


def test_comparison_text_lists_the_worst_layers_first(
    cnn_comparison: tuple[qinsight.Report, qinsight.Comparison],
) -> None:
    report, comparison = cnn_comparison
    assert comparison.activations is not None and comparison.configs is not None
    text = qinsight.to_text(report)
    assert "Float vs quantized (convert_fx, x86): cnn" in text
    section = text[text.index("Activations, worst local SQNR first") :]
    worst = comparison.activations.worst(count=1)[0]
    first_row = section.splitlines()[2].split()
    assert first_row[0] == worst.fqn
    assert float(first_row[-3]) == pytest.approx(worst.metric("sqnr", local=True), abs=0.05)
    wins = sum(row.best == "x86" for row in comparison.configs.rows)
    assert f"best per layer: x86 {wins}, per_tensor {len(comparison.configs.rows) - wins}" in text
    assert "Weights, worst first" in text and "bn folded" in text


def test_qinsight_show_prints_the_comparison(
    cnn_comparison: tuple[qinsight.Report, qinsight.Comparison], tmp_path: Path
) -> None:
    report, _ = cnn_comparison
    path = tmp_path / "cnn.json"
    qinsight.save_report(report, path)
    shown = run_cli("show", str(path), "--html", str(tmp_path / "cnn.html"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == qinsight.to_text(report)
    page = (tmp_path / "cnn.html").read_text()
    assert "<h2>Float vs quantized (convert_fx, x86)</h2>" in page
    assert "Candidate configs, local sqnr per layer" in page and page.count("data:image/png;base64") >= 2


def test_a_file_may_hold_a_comparison_only(tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    from _models import conv_bn_model
    from _peers import pt2e_quantized

    model = conv_bn_model()
    data = gaussian_batches((4, 3, 16, 16), 3, seed=5)
    converted, _ = pt2e_quantized(model, data)
    comparison = qinsight.Comparison(
        quantized="convert_pt2e, X86InductorQuantizer", activations=qinsight.compare_activations(model, converted, data)
    )
    report = qinsight.comparison_report(comparison, model_name="conv-bn")
    path = tmp_path / "only.json"
    qinsight.save_report(report, path)
    assert qinsight.load_report(path) == report
    text = qinsight.to_text(report)
    assert text.startswith("Float vs quantized (convert_pt2e, X86InductorQuantizer): conv-bn")
    assert "Suggested config" not in text and "block.2" in text  # block.0 is compared at its fused ReLU
    page = render_html(report)
    assert "Suggested config" not in page and "Activations, worst local SQNR first" in page
    assert report.metadata.batches == 3


def test_files_without_comparisons_from_schema_1_0_still_load(
    cnn_comparison: tuple[qinsight.Report, qinsight.Comparison],
) -> None:
    report, _ = cnn_comparison
    data = report_to_dict(attrs.evolve(report, comparison=None))
    data.pop("comparison", None)
    data["schema_version"] = [1, 0]
    loaded = report_from_json(json.dumps(data))
    assert loaded.comparison is None and loaded.sites == report.sites


def test_tables_stay_short_on_long_models() -> None:
    layers = tuple(
        qinsight.types.LayerActivationComparison(
            fqn=f"layer{i}",
            kind="linear",
            quantized_type="q",
            quantized=True,
            compared_at=f"layer{i}",
            batches=1,
            propagated=(MetricValue(name="sqnr", value=40.0 - i), MetricValue(name="relative_l2", value=0.01)),
            local=(MetricValue(name="sqnr", value=float(100 - i)), MetricValue(name="relative_l2", value=0.01)),
        )
        for i in range(30)
    )
    text = qinsight.to_text(qinsight.Comparison(activations=qinsight.ActivationComparison(layers=layers)), limit=5)
    rows = [line.split()[0] for line in text.splitlines()[2:7]]
    assert rows == ["layer29", "layer28", "layer27", "layer26", "layer25"]
    assert "(25 more layers in the file)" in text
