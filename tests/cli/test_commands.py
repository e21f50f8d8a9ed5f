"""The qinsight command, run as a real subprocess: every command and every exit code."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import pytest
from torch.ao.quantization import get_default_qconfig_mapping

import qinsight as api
from qinsight.examples import example
from qinsight.pipeline.config_comparison import quantize_candidates

from _cli import run_cli as qinsight


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    result = qinsight(
        "diagnose", "--example", "encoder", "--out", str(folder / "a.json"), "--html", str(folder / "a.html")
    )
    assert result.returncode == 0, result.stderr
    return folder


@pytest.mark.slow
def test_diagnose_example_prints_writes_and_shows_progress(saved: Path) -> None:
    result = qinsight("diagnose", "--example", "encoder", "--batches", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("qinsight report: encoder (fx frontend, backend x86, 3 calibration batches")
    assert "calibrating: 3/3, " in result.stderr and "/s, ETA" in result.stderr
    assert (saved / "a.json").stat().st_size > 1000
    assert (saved / "a.html").read_text().startswith("<!DOCTYPE html>")


def test_diagnose_a_model_from_factories(tmp_path: Path) -> None:
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "def model():\n    torch.manual_seed(0)\n    return torch.nn.Sequential(torch.nn.Linear(4, 8), "
        "torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()\n"
        "def batches():\n    g = torch.Generator().manual_seed(0)\n    return [torch.randn(16, 4, generator=g) for _ "
        "in range(3)]\n"
    )
    result = qinsight(
        "diagnose",
        "--model",
        "mymodels:model",
        "--data",
        "mymodels:batches",
        "--quiet",
        "--detectors",
        "qinsight.per_channel,qinsight.outliers",
        pythonpath=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("qinsight report: model (fx frontend") and result.stderr == ""
    assert "qinsight.dynamic_static" not in result.stdout and "qinsight.outliers" in result.stdout


@pytest.mark.slow
def test_gates_exit_1_and_name_the_modules(saved: Path) -> None:
    gated = qinsight("show", str(saved / "a.json"), "--fail-on", "dynamic recommended")
    assert gated.returncode == 1
    assert "qinsight: gate: qinsight.dynamic_static head: dynamic recommended" in gated.stderr
    typo = qinsight("show", str(saved / "a.json"), "--fail-on", "no such verdict")  # a gate that could never trip
    assert typo.returncode == 2 and "is no verdict of these detectors; valid: 'actionable'" in typo.stderr
    assert (
        qinsight(
            "diagnose", "--example", "cnn", "--batches", "2", "--fail-on", "actionable", "--quiet", "--no-verify"
        ).returncode
        == 1
    )


@pytest.mark.slow  # five commands: the whole suite's tier (show: test_qinsight_show_prints_the_comparison)
def test_show_diff_plot_detectors_schema(saved: Path) -> None:
    shown = qinsight("show", str(saved / "a.json"))
    assert shown.returncode == 0 and shown.stdout.startswith("qinsight report: encoder")
    same = qinsight("diff", str(saved / "a.json"), str(saved / "a.json"))
    assert (same.returncode, same.stdout) == (0, "no differences\n")
    png = saved / "ratios.png"
    plotted = qinsight(
        "plot", str(saved / "a.json"), "--feature", "outliers.ratios", "--module", "head", "--out", str(png)
    )
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    listed = qinsight("detectors")
    assert listed.returncode == 0 and "qinsight.outliers" in listed.stdout and "ok" in listed.stdout
    assert any(
        line.startswith("qinsight.formats") and line.endswith("(opt-in: --detectors)")
        for line in listed.stdout.splitlines()
    )
    schema = qinsight("schema")
    assert schema.returncode == 0 and '"schema_version"' in schema.stdout


@pytest.mark.slow  # a command's subprocesses: the whole suite's tier
def test_compare_quantizes_compares_and_writes_what_show_prints(tmp_path: Path) -> None:
    out, page = tmp_path / "c.json", tmp_path / "c.html"
    result = qinsight("compare", "--example", "cnn", "--batches", "3", "--out", str(out), "--html", str(page))
    assert result.returncode == 0 and result.stderr == f"qinsight: wrote {out}\nqinsight: wrote {page}\n", result.stderr
    assert result.stdout.startswith("Float vs quantized (convert_fx (x86 default)): cnn")
    assert qinsight("show", str(out)).stdout == result.stdout
    assert "Float vs quantized" in page.read_text()
    # The same numbers as the API on the same batches: calibrated on them, then compared on them.
    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = quantize_candidates(model, {"fx": get_default_qconfig_mapping("x86")}, batches)["fx"]
        expected = api.compare_activations(model, quantized, batches)
    saved = api.load_report(out).comparison
    assert saved is not None and saved.activations is not None
    assert [
        (layer.fqn, layer.metric("sqnr", local=True), layer.metric("sqnr")) for layer in saved.activations.layers
    ] == [(layer.fqn, layer.metric("sqnr", local=True), layer.metric("sqnr")) for layer in expected.layers]
    assert saved.weights is not None and {layer.fqn for layer in saved.weights.layers} == {"conv1", "block.0", "fc"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "flow", "title", "layers"),
    [
        ("cnn", "pt2e", "convert_pt2e (x86 default)", ("block.0", "conv1")),
        (
            "encoder",
            "torchao",
            "quantize_ (torchao Int8DynamicActivationInt8WeightConfig)",
            tuple(f"layers.{i}.{linear}" for i in (0, 1) for linear in ("qkv", "proj", "fc1", "fc2")),
        ),
    ],
)
def test_compare_in_the_pt2e_and_torchao_flows(name: str, flow: str, title: str, layers: tuple[str, ...]) -> None:
    pytest.importorskip("torchao")
    result = qinsight("compare", "--example", name, "--batches", "2", "--flow", flow)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Float vs quantized ({title}): {name}")
    weights = result.stdout.split("Weights, worst first")[1]
    assert all(layer in weights for layer in layers)


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ("--flow", "fx", "--lowered"),
            "--flow fx cannot be compared with --lowered: --lowered lowers a PT2E model; use --flow pt2e$",
        ),
        (
            ("--flow", "pt2e", "--backend", "qnnpack"),
            r"compare: backend='qnnpack' is invalid; expected one of (\w+, )*x86, xnnpack for flow='pt2e' "
            r"\(qnnpack is served by flow='fx'\)",
        ),
    ],
)
def test_compare_says_which_flow_a_backend_or_lowering_needs(args: tuple[str, ...], message: str) -> None:
    """(A third party's backend, installed, is among those listed: CI installs plugins/.)"""
    result = qinsight("compare", "--example", "cnn", "--batches", "1", *args)
    assert result.returncode == 2 and re.fullmatch(f"qinsight: error: {message}\n", result.stderr)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (
            ("compare", "--example", "cnn", "--flow", "pt2e", "--backend", "fbgemm"),
            "x86, xnnpack for flow='pt2e'",
        ),
        (("compare", "--model", "qinsight.examples:example"), "--model needs --data"),
        (("diagnose", "--example", "cnn", "--batches", "0"), "qinsight: error: --batches must be at least 1"),
        (("diagnose", "--example", "cnn", "--backend", "tpu"), "backend='tpu' is invalid"),
        (("diagnose", "--model", "nowhere:model", "--data", "nowhere:data"), "cannot load --model nowhere:model"),
        (("diagnose", "--model", "qinsight.examples:example"), "--model needs --data"),
        (("show", "/nonexistent/report.json"), "/nonexistent/report.json: No such file or directory"),
        (("plot", "/nonexistent/report.json", "--feature", "x", "--out", "x.png"), "No such file or directory"),
    ],
)
def test_errors_exit_2_with_one_line(args: tuple[str, ...], message: str) -> None:
    result = qinsight(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    assert qinsight("diagnose").returncode == 2  # argparse: one of --example/--model required
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    debug = qinsight("--debug", "show", str(bad))
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ReportFileError" in debug.stderr


@pytest.mark.slow
def test_plan_reaches_a_target_writes_the_plan_and_exits_one_when_it_cannot(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = qinsight(
        "plan", "--example", "cnn", "--batches", "3", "--eval-batches", "2", "--target", "sqnr>=30", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert "Plan (fx, backend x86): target sqnr>=30 reached" in result.stdout
    assert "scoring the curve: 0/" in result.stderr and result.stderr.endswith(f"qinsight: wrote {out}\n")
    loaded = api.load_report(out)
    assert loaded.plan is not None and loaded.plan.reached and loaded.plan.verified_score >= 30.0
    assert qinsight("show", str(out)).stdout == result.stdout
    # a target no config can reach: the report still prints, and the exit code says so
    unreachable = qinsight(
        "plan", "--example", "cnn", "--batches", "3", "--eval-batches", "2", "--target", "sqnr>=200", "--quiet"
    )
    assert unreachable.returncode == 1 and "target sqnr>=200 NOT reached" in unreachable.stdout
    assert unreachable.stderr == "qinsight: the plan does not reach sqnr>=200\n"
    # --smooth: the Linear's input smoothed first, the plan saying so and named as in the smoothed model
    out = tmp_path / "smoothed.json"
    smoothed = qinsight(
        "plan", "--example", "cnn", "--batches", "3", "--eval-batches", "2", "--smooth", "--quiet", "--out", str(out)
    )
    assert smoothed.returncode == 0, smoothed.stderr
    assert "smoothed the input of 1 Linear (alpha " in smoothed.stdout  # measured: alpha 0.5, 37.7 dB (37.3 without)
    plan = api.load_report(out).plan
    assert plan is not None and plan.smoothing.fqns == ("fc",) and "fc.linear" in {s.fqn for s in plan.sensitivities}
    # --correct-biases: the default's biases corrected first where that scores better, measured either way
    out = tmp_path / "corrected.json"
    corrected = qinsight(
        "plan", "--example", "cnn", "--backend", "xnnpack", "--batches", "3", "--eval-batches", "2",
        "--correct-biases", "--quiet", "--out", str(out),
    )  # fmt: skip
    assert corrected.returncode == 0, corrected.stderr
    plan = api.load_report(out).plan
    assert plan is not None and any(c.kinds == (api.types.SuggestionKind.BIAS_CORRECTION,) for c in plan.checks)
    assert ("the config is for qinsight.bias_corrected(model, plan)" in corrected.stdout) == bool(plan.bias_correction)
    bad = qinsight("plan", "--example", "cnn", "--target", "sqnr>30")
    assert bad.returncode == 2 and bad.stderr.startswith("qinsight: error: --target 'sqnr>30': expected a target like")
    for args, expected in (
        (("--target", "top1>=1.5"), "between 0 and 1"),
        (("--target", "float<=2"), "--target 'float<=2' is a size: --budget float<=2"),
        (("--budget", "float<=-3"), "at most N sites kept in float (qinsight.plan), N a whole number"),
        (("--budget", "bits<=6"), "(bits<=N is mean bits per weight"),
        (("--budget", "float<=2", "--target", "sqnr>=30"), "a plan for fx or pt2e takes one"),
        (("--speed", "speedup>=1.5"), "--speed bounds the program a PT2E plan lowers: add --lowered"),
        (("--speed", "speedup<=1.5", "--lowered", "--backend", "xnnpack"), "--speed 'speedup<=1.5': expected a"),
    ):
        bad = qinsight("plan", "--example", "cnn", *args)
        assert bad.returncode == 2 and expected in bad.stderr and bad.stdout == "", bad.stderr
    bad = qinsight("plan", "--example", "cnn", "--target", "sqnr>=30", "--confidence", "0.95")
    assert bad.returncode == 2 and "--confidence holds a top1 target" in bad.stderr and bad.stdout == ""
    # a top1 target held at its bound over the 40 evaluation rows: the plan file says at which confidence
    held = qinsight(
        "plan",
        "--example",
        "cnn",
        "--batches",
        "3",
        "--eval-batches",
        "5",
        "--target",
        "top1>=0.9",
        "--confidence",
        "0.95",
        "--quiet",
        "--out",
        str(out),
    )
    assert held.returncode == 0, held.stderr
    plan = api.load_report(out).plan
    assert plan is not None and plan.confidence == 0.95 and "95% lower bound over the 40 evaluation rows" in held.stdout


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_plan_with_the_torchao_flow_gives_a_format_per_linear_under_a_budget(tmp_path: Path) -> None:
    pytest.importorskip("torchao.quantization")
    out = tmp_path / "formats.json"
    args = ("plan", "--example", "encoder", "--batches", "2", "--eval-batches", "4", "--flow", "torchao", "--quiet")
    result = qinsight(*args, "--target", "sqnr>=20", "--budget", "bits<=7", "--out", str(out))
    loaded = api.load_report(out).formats
    assert loaded is not None and loaded.budget is not None and loaded.mean_bits <= 7.0
    assert result.returncode == (0 if loaded.reached else 1), result.stderr
    headline = result.stdout.splitlines()[2]  # each part of the goal says whether it held
    assert (
        headline.startswith("Format plan (torchao quantize_, int8, int4_g32): sqnr>=20 ")
        and "; bits<=7 held: " in headline
    )
    assert "\nqinsight.formats (margin_db=3.0, min_bits=4.0)\n" in result.stdout  # what each format loses, per Linear
    for option, value, named in (
        ("--formats", "int8,int3", "formats='int3'"),
        ("--budget", "bytes<=5", "--budget 'bytes<=5': expected 'bits<=N'"),
        ("--confidence", "1.5", "confidence=1.5"),
    ):
        refused = qinsight(*args, option, value)
        assert refused.returncode == 2 and refused.stdout == "" and named in refused.stderr, refused.stderr
        assert len(refused.stderr.splitlines()) == 1


@pytest.mark.slow  # a command's subprocesses: the whole suite's tier
def test_diagnose_verifies_as_asked_and_gates_on_an_unverified_config() -> None:
    verified = qinsight(
        "diagnose", "--example", "cnn", "--batches", "4", "--verify", "fx", "--fail-on", "unverified", "--quiet"
    )
    assert verified.returncode == 0, verified.stderr
    assert (
        "fx: the report's config" in verified.stdout
        and "input-weight equalization (1 module): not applied" in verified.stdout
    )
    unverified = qinsight(
        "diagnose", "--example", "cnn", "--batches", "2", "--no-verify", "--fail-on", "unverified", "--quiet"
    )
    assert unverified.returncode == 1 and "Not verified" in unverified.stdout
    assert "qinsight: gate: unverified: the report's config was verified in no flow" in unverified.stderr
    both = qinsight("diagnose", "--example", "cnn", "--verify", "fx", "--no-verify")
    assert both.returncode == 2 and "--verify and --no-verify: choose one" in both.stderr
    typo = qinsight("diagnose", "--example", "cnn", "--verify", "onnx")
    assert typo.returncode == 2 and "--verify 'onnx'" in typo.stderr


@pytest.mark.slow  # a command's subprocesses: the whole suite's tier
def test_hf_mistakes_end_in_one_line(tmp_path: Path) -> None:
    missing = qinsight("diagnose", "--hf", str(tmp_path / "nowhere.gguf"), "--quiet")
    if "needs Hugging Face transformers" in missing.stderr:
        pytest.skip("the hf extra is not installed")
    assert missing.returncode == 2 and "--hf " in missing.stderr and "no such folder or .gguf file" in missing.stderr
    assert missing.stderr.count("\n") == 1
    text_alone = qinsight("diagnose", "--example", "cnn", "--text", str(tmp_path / "t.txt"))
    assert text_alone.returncode == 2 and "--text and --eval-text are for --hf" in text_alone.stderr


@pytest.mark.slow
@pytest.mark.extended(3)
def test_diagnose_a_hugging_face_gguf_with_its_own_tokenizer_verified_in_pt2e(tmp_path: Path) -> None:
    from _real import smollm2_hf_or_skip

    smollm2_hf_or_skip()  # skips without transformers or the packaged weights
    from qinsight.examples.smollm import gguf_path

    text = tmp_path / "calibration.txt"
    text.write_text(
        "The harbour filled with small boats.\n\nFishermen repaired their nets on the quay.\n", encoding="utf-8"
    )
    out = tmp_path / "smollm.json"
    result = qinsight(
        "diagnose", "--hf", str(gguf_path()), "--text", str(text), "--tokens", "16", "--quiet", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        f"qinsight report: {gguf_path().name} (eager frontend, backend x86, 2 calibration batches"
    )
    assert "Converting and de-quantizing" not in result.stderr  # --quiet: transformers' progress bars too
    report = api.load_report(out)
    assert any(site.fqn == "model.layers.11.mlp.down_proj" for site in report.sites)  # transformers' own names
    assert len(result.stdout.splitlines()) <= 60
    # FX cannot trace transformers' Llama: its config is verified for real in PT2E (exported without its cache)
    # and in torchao's quantize_
    assert [v.flow for v in report.verification] == ["pt2e", "torchao"]
    for verdict in report.verification:
        assert verdict.verified and math.isfinite(verdict.score) and verdict.score >= verdict.default
    assert (
        "Verified for real (qinsight.pt2e_quantizer(report) / qinsight.quantize(model, report, data, flow='torchao')"
        in (result.stdout)
    )


@pytest.mark.slow  # two commands' subprocesses: the whole suite's tier
def test_diagnose_and_plan_judge_one_model_against_the_same_default_plan(tmp_path: Path) -> None:
    """One model, one verdict: plan diagnoses against the backend's default QConfigMapping as diagnose
    does (x86 quantizes the weights per channel already; --qconfig, shared, says otherwise)."""
    common = ("--example", "cnn", "--batches", "3", "--quiet")
    diagnosed = qinsight("diagnose", *common, "--no-verify", "--out", str(tmp_path / "d.json"))
    planned = qinsight("plan", *common, "--eval-batches", "2", "--out", str(tmp_path / "p.json"))
    assert (diagnosed.returncode, planned.returncode) == (0, 0), planned.stderr

    def verdicts(name: str) -> list[tuple[str, str]]:
        return [(f.fqn, f.verdict) for f in api.load_report(tmp_path / name).result("qinsight.per_channel").findings]

    assert verdicts("p.json") == verdicts("d.json") and {v for _, v in verdicts("d.json")} == {"per-channel in use"}
    assert "per-channel recommended" not in planned.stdout


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_diagnose_for_xnnpack_judges_the_findings_against_xnnpacks_default_quantizer(tmp_path: Path) -> None:
    """--qconfig default is the backend's first flow's default config: for xnnpack, XNNPACKQuantizer's
    symmetric per-channel one, asked on the exported graph (weights per channel already)."""
    pytest.importorskip("executorch")
    result = qinsight(
        "diagnose",
        "--example",
        "cnn",
        "--batches",
        "2",
        "--quiet",
        "--no-verify",
        "--backend",
        "xnnpack",
        "--out",
        str(tmp_path / "x.json"),
    )
    assert result.returncode == 0, result.stderr
    findings = api.load_report(tmp_path / "x.json").result("qinsight.per_channel").findings
    assert {f.verdict for f in findings} == {"per-channel in use"} and len(findings) == 3


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_diagnose_takes_its_backend_from_the_qconfig_quantizer(tmp_path: Path) -> None:
    """--qconfig module:factory returning XNNPACKQuantizer (per-tensor), no --backend: the report is
    for xnnpack, judged against that quantizer; --backend x86 beside it is the one-line error."""
    pytest.importorskip("executorch")
    (tmp_path / "myquantizers.py").write_text(
        "from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, "
        "get_symmetric_quantization_config\n"
        "def per_tensor():\n"
        "    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False))\n"
    )
    common = (
        "diagnose",
        "--example",
        "cnn",
        "--batches",
        "2",
        "--quiet",
        "--no-verify",
        "--qconfig",
        "myquantizers:per_tensor",
    )
    result = qinsight(*common, "--out", str(tmp_path / "x.json"), pythonpath=tmp_path)
    assert result.returncode == 0, result.stderr
    report = api.load_report(tmp_path / "x.json")
    assert report.metadata.backend == "xnnpack"
    assert {f.verdict for f in report.result("qinsight.per_channel").findings} == {"per-channel recommended"}
    refused = qinsight(*common, "--backend", "x86", pythonpath=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "expected 'xnnpack', the backend your XNNPACKQuantizer quantizes for (or leave backend out)"
    ), refused.stderr
