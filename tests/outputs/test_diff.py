"""diff_reports: verdicts, numbers, suggestions, modules and detectors that changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from _data import gaussian_batches, shifting_batches
from _models import MLP, seeded

import qinsight
from qinsight import diff_reports


def test_same_report_has_no_differences() -> None:
    report = qinsight.diagnose(seeded(MLP()), gaussian_batches((16, 16), 4))
    assert diff_reports(report, report).empty
    assert diff_reports(report, report).to_text() == "no differences\n"


def test_changed_data_moves_verdicts_numbers_and_suggestions() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval()
    with torch.no_grad():
        model[0].weight.uniform_(0.1, 1.0)
    stationary = qinsight.diagnose(model, gaussian_batches((32, 8), 8), detectors=["qinsight.dynamic_static"])
    shifting = qinsight.diagnose(model, shifting_batches((32, 8), 8), detectors=["qinsight.dynamic_static"])
    changes = diff_reports(stationary, shifting)
    assert [(v.fqn, v.before, v.after) for v in changes.verdicts] == [("0", "static", "dynamic recommended")]
    moved = {n.field for n in changes.numbers}
    assert {"input.statistic", "output.statistic"} <= moved
    assert [(s.before, s.after) for s in changes.suggestions] == [("activation static", "activation dynamic")]
    assert "qinsight.dynamic_static 0: static -> dynamic recommended" in qinsight.to_text(changes)


def test_modules_and_detectors_added_and_removed() -> None:
    small = qinsight.diagnose(
        torch.nn.Sequential(torch.nn.Linear(4, 4)).eval(), [torch.randn(2, 4)], detectors=["qinsight.per_channel"]
    )
    large = qinsight.diagnose(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).eval(),
        [torch.randn(2, 4)],
        detectors=["qinsight.outliers"],
    )
    changes = diff_reports(small, large)
    assert (changes.modules_added, changes.modules_removed) == (("1",), ())
    assert (changes.detectors_added, changes.detectors_removed) == (("qinsight.outliers",), ("qinsight.per_channel",))


def test_diff_command(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    qinsight.save_report(qinsight.diagnose(seeded(MLP()), gaussian_batches((16, 16), 4)), a)
    qinsight.save_report(
        qinsight.diagnose(seeded(MLP()), gaussian_batches((16, 16), 4, seed=9) + [torch.zeros(16, 16)]), b
    )
    out = subprocess.run(
        [sys.executable, "-m", "qinsight", "diff", str(a), str(b)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "qinsight.dynamic_static fc1.input.constant_batches: 0 -> 1" in out.stdout


def test_a_flag_read_back_as_a_number_is_a_change() -> None:
    """True == 1 in Python, not in a file: the outlier detector's ``tails`` flag written as 1 differs
    (found by the hypothesis test of tests/pipeline/test_bad_inputs.py once the first bool parameter existed)."""
    import json

    from qinsight.outputs.serde import report_from_json, report_to_dict

    report = qinsight.diagnose(seeded(MLP()), gaussian_batches((8, 16), 2), model_name="mlp")
    data = report_to_dict(report)
    outliers = next(r for r in data["results"] if r["detector"] == "qinsight.outliers")
    flag = next(p for p in outliers["parameters"] if p["name"] == "tails")
    assert flag["value"] is True
    flag["value"] = 1
    changes = diff_reports(report, report_from_json(json.dumps(data)), rel_tol=0, abs_tol=0).fields
    assert [(c.before, c.after) for c in changes] == [("true", "1")]


def test_a_long_array_moves_within_the_tolerances_or_counts_its_moved_values() -> None:
    # per-channel arrays are typed binary in a file; a diff compares their values, not their bytes
    import json

    from qinsight.outputs.serde import report_from_json, report_to_dict

    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 2), model_name="mlp")
    data = report_to_dict(report, packed=False)
    channel_max = data["observations"][0]["stats"]["channel_max"]
    assert len(channel_max) >= 16
    channel_max[3] *= 1 + 1e-12
    moved = report_from_json(json.dumps(data))
    assert diff_reports(report, moved, rel_tol=1e-9, abs_tol=0).fields == ()
    changes = diff_reports(report, moved, rel_tol=0, abs_tol=0).fields
    assert [(c.before, c.after) for c in changes] == [(f"{len(channel_max)} values", "1 of them moved")]
