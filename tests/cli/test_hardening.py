"""The command as a new user and an attacker meet it: one line and the right exit code for every
failure, gates that cannot silently pass, nothing destroyed, nothing raw on the terminal."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

import qinsight as api
from qinsight.cli import main
from qinsight.plugin.testing import write_distribution

from _cli import run_cli as qinsight


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reports")
    for name, args in {
        # files for the commands that read them: unverified, for speed
        "cnn": ("diagnose", "--example", "cnn", "--batches", "2", "--quiet", "--no-verify"),
        "cnn_fbgemm": (
            "diagnose",
            "--example",
            "cnn",
            "--batches",
            "2",
            "--quiet",
            "--no-verify",
            "--backend",
            "fbgemm",
        ),
        "cmp_cnn": ("compare", "--example", "cnn", "--batches", "2"),
        "cmp_encoder": ("compare", "--example", "encoder", "--batches", "2"),
    }.items():
        assert main([*args, "--out", str(folder / f"{name}.json")]) == 0
    return folder


def one_error_line(result: object, code: int = 2) -> str:
    assert getattr(result, "returncode") == code, getattr(result, "stderr")
    lines = getattr(result, "stderr").strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qinsight: error: ") and "Traceback" not in lines[0], lines
    return str(lines[0])


def test_a_gate_that_can_never_trip_is_an_error(reports: Path) -> None:
    typo = one_error_line(
        qinsight("diagnose", "--example", "cnn", "--batches", "2", "--quiet", "--fail-on", "outlier channel")
    )
    assert "'outlier channel' is no verdict of these detectors" in typo and "'outlier channels'" in typo
    unknown = one_error_line(
        qinsight("diagnose", "--example", "cnn", "--detectors", "acme.typo", "--fail-on", "actionable")
    )
    assert "no detector 'acme.typo' is installed; installed: " in unknown and "qinsight.outliers" in unknown


def test_per_channel_is_in_use_under_the_backends_default(reports: Path) -> None:
    # the CLI judges findings against the backend's default QConfigMapping: x86 already quantizes weights
    # per channel, so `--fail-on actionable` does not trip on every Linear/Conv
    report = api.load_report(reports / "cnn.json")
    verdicts = {f.verdict for f in report.result("qinsight.per_channel").findings}
    assert verdicts == {"per-channel in use"}
    planless = qinsight(
        "diagnose",
        "--example",
        "cnn",
        "--batches",
        "2",
        "--quiet",
        "--no-verify",
        "--qconfig",
        "none",
        "--fail-on",
        "per-channel recommended",
    )
    assert planless.returncode == 1 and "qinsight.per_channel conv1: per-channel recommended" in planless.stderr


def test_diff_sees_every_difference_and_gates(reports: Path) -> None:
    models = qinsight("diff", str(reports / "cmp_cnn.json"), str(reports / "cmp_encoder.json"), "--fail-on", "any")
    assert models.returncode == 1 and '$.metadata.model: "cnn" -> "encoder"' in models.stdout
    backend = qinsight("diff", str(reports / "cnn.json"), str(reports / "cnn_fbgemm.json"))
    assert backend.returncode == 0 and '$.metadata.backend: "x86" -> "fbgemm"' in backend.stdout
    data = json.loads((reports / "cmp_cnn.json").read_text())
    layer = data["comparison"]["activations"]["layers"][0]
    sqnr = next(v for v in layer["local"] if v["name"] == "sqnr")
    sqnr["value"] -= 4.0
    worse = reports / "cmp_cnn_worse.json"
    worse.write_text(json.dumps(data))
    tripped = qinsight("diff", str(reports / "cmp_cnn.json"), str(worse), "--fail-on", "sqnr-drop=3")
    assert (
        tripped.returncode == 1
        and f"qinsight: gate: activations (local) {layer['fqn']}: SQNR fell 4.0 dB" in tripped.stderr
    )
    assert qinsight("diff", str(reports / "cmp_cnn.json"), str(worse), "--fail-on", "sqnr-drop=5").returncode == 0
    assert "no diff gate; valid: any, verdict" in one_error_line(
        qinsight("diff", str(worse), str(worse), "--fail-on", "sqnr")
    )


def test_outputs_are_written_whole_or_not_at_all(
    reports: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.html"
    page.write_text("the page from yesterday")

    def broken(_report: object) -> str:
        raise ValueError("the renderer broke")

    monkeypatch.setattr("qinsight.outputs.html.render_html", broken)
    assert main(["show", str(reports / "cnn.json"), "--html", str(page)]) == 2
    assert page.read_text() == "the page from yesterday" and sorted(os.listdir(tmp_path)) == ["page.html"]
    assert capsys.readouterr().err == "qinsight: error: ValueError: the renderer broke\n"

    folder = tmp_path / "a-folder"
    folder.mkdir()
    line = one_error_line(qinsight("show", str(reports / "cnn.json"), "--html", str(folder)))
    assert line == f"qinsight: error: {folder}: is a folder, not a file" and os.listdir(folder) == []
    report = reports / "cnn.json"
    before = report.read_bytes()
    assert "is an input of this command" in one_error_line(qinsight("show", str(report), "--html", str(report)))
    assert report.read_bytes() == before


@pytest.mark.slow
def test_files_get_the_umasks_mode_and_their_paths_are_said(tmp_path: Path) -> None:
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    old = os.umask(0o022)
    try:
        result = qinsight(
            "diagnose",
            "--example",
            "cnn",
            "--batches",
            "2",
            "--quiet",
            "--no-verify",
            "--out",
            str(out),
            "--html",
            str(page),
        )
    finally:
        os.umask(old)
    assert result.returncode == 0 and result.stderr == f"qinsight: wrote {out}\nqinsight: wrote {page}\n"
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(page.stat().st_mode) == 0o644


FACTORIES = """
import sys, torch
def model():
    return torch.nn.Sequential(torch.nn.Linear(4, 2))
def failing_data():
    yield torch.randn(2, 4)
    raise OSError("the data disk went away")
def exiting_data():
    sys.exit(3)
def interrupted_data():
    raise KeyboardInterrupt
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "data,code,message",
    [
        (
            "failing_data",
            2,
            "qinsight: error: the calibration data raised at batch 1: OSError: the data disk went away",
        ),
        ("exiting_data", 2, "qinsight: error: something the command ran called sys.exit(3)"),
        ("interrupted_data", 130, "qinsight: error: interrupted"),
    ],
)
def test_failures_of_user_code_are_one_line_with_their_exit_code(
    tmp_path: Path, data: str, code: int, message: str
) -> None:
    (tmp_path / "userfactories.py").write_text(FACTORIES)
    result = qinsight(
        "diagnose", "--model", "userfactories:model", "--data", f"userfactories:{data}", "--quiet", pythonpath=tmp_path
    )
    assert one_error_line(result, code) == message


@pytest.mark.slow  # the console script: the whole suite's tier (python -m: test_diagnose_a_model_from_factories)
def test_the_console_command_finds_modules_in_the_current_folder(tmp_path: Path) -> None:
    (tmp_path / "userfactories.py").write_text(FACTORIES + "def data():\n    return [torch.randn(2, 4)]\n")
    command = Path(sys.executable).parent / "qinsight"
    if not command.exists():
        pytest.skip("the qinsight console script is not installed next to this python")
    result = __import__("subprocess").run(
        [str(command), "diagnose", "--model", "userfactories:model", "--data", "userfactories:data", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("qinsight report: model")


def test_a_plugin_that_exits_on_import_is_a_load_failure(tmp_path: Path) -> None:
    root = write_distribution(
        tmp_path, "acme-exit", {"acme_exit": "import sys\nsys.exit(7)\n"}, {"acme.exit": "acme_exit:Detector"}
    )
    listed = qinsight("detectors", pythonpath=root)
    assert listed.returncode == 0 and "acme.exit" in listed.stdout and "FAILED: SystemExit: 7" in listed.stdout


def test_terminal_escapes_in_a_file_are_shown_not_obeyed(reports: Path, tmp_path: Path) -> None:
    hostile = tmp_path / "escapes.json"
    hostile.write_text((reports / "cnn.json").read_text().replace('"conv1"', '"conv1\\u001b[2J\\u0007"'))
    shown = qinsight("show", str(hostile))
    assert shown.returncode == 0 and "conv1\\x1b[2J\\x07" in shown.stdout and "\x1b" not in shown.stdout


def test_progress_in_a_log_is_lines_and_always_ends(tmp_path: Path) -> None:
    (tmp_path / "userfactories.py").write_text(
        FACTORIES + "def data():\n    return (torch.randn(2, 4) for _ in range(5))\n"
    )
    result = qinsight("diagnose", "--model", "userfactories:model", "--data", "userfactories:data", pythonpath=tmp_path)
    assert result.returncode == 0 and "\r" not in result.stderr and result.stderr.endswith("\n")
    lines = result.stderr.splitlines()  # unknown length: a line at the start, at powers of two, and the last count
    calibrating = [line.split(",")[0] for line in lines if line.startswith("calibrating")]
    assert calibrating == ["calibrating: 0", "calibrating: 1", "calibrating: 2", "calibrating: 4", "calibrating: 5"]
    # then the verification, which the defaults run, to its end
    assert lines[len(calibrating) :] and lines[-1].startswith("verifying the report's config in fx: 1/1, "), lines


def test_version_plot_features_and_the_full_module_list(reports: Path) -> None:
    assert qinsight("--version").stdout == f"qinsight {api.__version__}\n"
    features = qinsight("plot", str(reports / "cnn.json"))
    assert features.returncode == 0 and "outliers.ratios" in features.stdout.splitlines()
    assert "--feature needs --out" in one_error_line(
        qinsight("plot", str(reports / "cnn.json"), "--feature", "outliers.ratios")
    )
    shown = qinsight("show", str(reports / "cnn.json"))
    assert "Terms (docs/detectors.md" in shown.stdout
