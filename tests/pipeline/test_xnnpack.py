"""diagnose(..., backend="xnnpack"): the report is verified through XNNPACKQuantizer (PT2E, the only flow
serving XNNPACK), its advice comes back as that quantizer, and it holds in the program ExecuTorch runs."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from _checks import warns_note

import qinsight
from qinsight.examples.builtin import example
from qinsight.outputs.html import render_html
from qinsight.types import NoteKind

pytest.importorskip("executorch")


def test_an_xnnpack_report_is_verified_in_pt2e_and_speaks_that_flow() -> None:
    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(8)
    report = qinsight.diagnose(model, batches, deploy="xnnpack")
    assert [verdict.flow for verdict in report.verification] == ["pt2e"]
    assert report.verification[0].verified and report.fx_activations is None
    with warns_note(NoteKind.UNEQUALIZED) as notes:
        quantizer = qinsight.pt2e_quantizer(report)  # the report's own backend, XNNPACK
    unequalized = [note for note in notes if note.kind is NoteKind.UNEQUALIZED]
    assert [note.text.endswith(": fc") for note in unequalized] == [True]  # the module it leaves unequalized, named
    assert type(quantizer.inner).__name__ == "XNNPACKQuantizer"
    text = qinsight.to_text(report)
    assert "Verified for real (qinsight.pt2e_quantizer(report) leaves out what was dropped):" in text
    assert "qinsight.qconfig_mapping(report)" not in text
    assert "xnnpack quantizes through PT2E: <code>qinsight.pt2e_quantizer(report)</code>" in render_html(report)
    with pytest.raises(
        qinsight.errors.InvalidParameterError, match=r"for flow='fx' \(xnnpack is served by flow='pt2e'\)"
    ):
        qinsight.qconfig_mapping(report)
    with pytest.raises(
        qinsight.errors.InvalidParameterError,
        match="backend='xnnpack' is invalid; expected one of fbgemm, onednn, qnnpack, x86 for flow='fx'",
    ):
        qinsight.diagnose(model, batches, deploy="xnnpack", verify="fx")


@pytest.mark.slow
def test_the_xnnpack_reports_advice_holds_in_the_program_executorch_runs() -> None:
    """The encoder's attention projections want dynamic activations, one Linear float: XNNPACK's static
    default leaves the program 14 dB from fp32 on batches calibration never saw, the report's
    XNNPACKQuantizer 46 dB (measured: 14.1 and 45.8)."""
    from qinsight.backends.xnnpack import default_xnnpack_quantizer
    from qinsight.pipeline import quantize_candidates

    chosen = example("encoder")
    model, batches = chosen.model(), chosen.data(16)
    calibration, unseen = batches[:8], batches[8:]
    report = qinsight.diagnose(model, calibration, deploy="xnnpack")
    verdict = report.verification_for("pt2e")
    assert verdict is not None and verdict.score > verdict.default + 10.0
    ours = qinsight.quantize(model, report, calibration)  # the report's own flow: PT2E, XNNPACKQuantizer
    default = quantize_candidates(model, {"default": default_xnnpack_quantizer()}, calibration)["default"]
    shipped = {
        name: qinsight.compare_lowered(model, converted, unseen, layers=False, float_program=False)
        for name, converted in (("ours", ours), ("default", default))
    }
    assert shipped["ours"].metric("lowered_vs_float") > shipped["default"].metric("lowered_vs_float") + 20.0
    assert shipped["ours"].metric("lowered_vs_float") > 35.0


@pytest.mark.extended(1)  # lowered scores in CI: the XNNPACK advice and plan tests, each on the runtime's program
def test_verify_report_lowered_scores_the_program_executorch_runs() -> None:
    """Each config scored as its XNNPACK program: the verdict's score is that program's SQNR against
    fp32 on the held-out quarter, as compare_lowered measures it after calibrating on the rest."""
    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(8)
    report = qinsight.diagnose(model, batches, deploy="xnnpack", verify=False)
    verified = qinsight.verify_report(model, report, batches, lowered=True)
    verdict = verified.verification_for("pt2e")
    assert verdict is not None and verdict.lowered.endswith("runtime, XNNPACK delegate")
    assert f"as lowered ({verdict.lowered}) on 2 held-out batches" in verdict.describe()
    converted = qinsight.quantize(model, verified, batches[:6])
    shipped = qinsight.compare_lowered(model, converted, batches[6:], layers=False, float_program=False)
    assert verdict.score == pytest.approx(shipped.metric("lowered_vs_float"), abs=1e-6)
    with pytest.raises(
        qinsight.errors.InvalidParameterError,
        match=r"lowered=True is invalid; expected flows whose model is lowered \(pt2e\), not fx",
    ):
        qinsight.verify_report(
            model, qinsight.diagnose(model, batches, verify=False), batches, flows="fx", lowered=True
        )
    with pytest.raises(qinsight.errors.InvalidParameterError, match=r"^diagnose: lowered=True is invalid; .* not fx$"):
        qinsight.diagnose(
            model, batches, deploy=qinsight.types.Deployment(lowered=True)
        )  # x86 verifies in FX: refused before calibration
    lowered = qinsight.diagnose(
        model, batches, deploy=qinsight.types.Deployment(backend="xnnpack", lowered=True)
    ).verification_for("pt2e")
    assert lowered is not None and lowered.lowered == verdict.lowered and lowered.score == verdict.score


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_verification_starts_from_the_users_quantizer(tmp_path: Path) -> None:
    """diagnose(quantizer=q) without a backend: the report is for q's backend, verified in q's flow, and
    q itself is scored beside the flow's default: its score is q applied by hand (export,
    prepare_pt2e, calibrate on the first three quarters, convert) on the held-out quarter."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from qinsight.compare.metric_functions import sqnr
    from qinsight.pipeline.verifier import noting_yours

    chosen = example("cnn")
    model, batches = chosen.model().eval(), chosen.data(8)
    yours = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False))
    report = qinsight.diagnose(model, batches, deploy=yours)
    verdict = report.verification_for("pt2e")
    assert report.metadata.backend == "xnnpack" and verdict is not None and verdict.yours_from == "XNNPACKQuantizer"
    prepared = prepare_pt2e(torch.export.export(model, (batches[0],)).module(), yours)
    with torch.no_grad():
        for batch in batches[:6]:
            prepared(batch)
        quantized = convert_pt2e(prepared)
        by_hand = sqnr(torch.cat([model(b) for b in batches[6:]]), torch.cat([quantized(b) for b in batches[6:]]))
    assert verdict.yours == pytest.approx(by_hand, abs=1e-6)
    assert f"(your XNNPACKQuantizer {verdict.yours:.1f} dB, the flow's default" in verdict.describe()
    said = NoteKind.KEEP_YOURS in [note.kind for note in verdict.notes]
    assert said == (verdict.yours > verdict.score)
    qinsight.save_report(report, tmp_path / "report.json")
    assert qinsight.load_report(tmp_path / "report.json").verification_for("pt2e") == verdict
    beaten = noting_yours(attrs.evolve(verdict, yours=verdict.score + 1.0))
    assert beaten.notes[-1].kind is NoteKind.KEEP_YOURS and "XNNPACKQuantizer" in beaten.notes[-1].text
    x86_report = qinsight.diagnose(model, batches, verify=False)
    with pytest.raises(qinsight.errors.InvalidParameterError, match="^verify_report: backend='x86' is invalid"):
        qinsight.verify_report(model, x86_report, batches, quantizer=yours)
