"""plan(..., repairs=Repairs(bias_correction=True)): the default config's biases corrected first where that
scores better for real, the plan made for the corrected model, and what ships applies the correction."""

from __future__ import annotations

import tempfile

import pytest
import torch
from _checks import warns_note
from _peers import sqnr

import qinsight
from qinsight.core.verification import SuggestionKind
from qinsight.examples.builtin import example
from qinsight.types import NoteKind, Repairs


def test_a_plan_that_corrects_the_biases_first_ships_the_config_it_verified() -> None:
    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(12)
    calibration, evaluation, held_out = batches[:6], batches[6:10], batches[10:]
    plan = qinsight.plan(
        model,
        calibration,
        evaluation,
        goal="sqnr>=44",
        deploy="xnnpack",
        repairs=Repairs(bias_correction=True),
        held_out_data=held_out,
    )
    check = next(c for c in plan.checks if SuggestionKind.BIAS_CORRECTION in c.kinds)
    # measured here: the corrected default 42.808 dB against 42.805 without, so it is kept
    assert check.kept and check.alone > check.before and check.before == pytest.approx(plan.default_score)
    assert check.change == f"biases corrected in {len(plan.bias_correction)} layers" and plan.bias_correction.entries
    assert plan.reached and plan.verified_score >= 44
    with warns_note(NoteKind.BIAS_CORRECTED):
        qinsight.pt2e_quantizer(plan)  # the user's own prepare_pt2e must get the corrected model: said
    quantized = qinsight.quantize(model, plan, calibration)  # corrects the biases itself
    with torch.no_grad():
        reference = torch.cat([model(b) for b in evaluation])
        ours = torch.cat([quantized(b) for b in evaluation])
    assert plan.verified_score == pytest.approx(sqnr(reference, ours), abs=1e-4)
    corrected = qinsight.bias_corrected(model, plan)
    moved = {name for name, value in corrected.state_dict().items() if not torch.equal(value, model.state_dict()[name])}
    assert moved == {f"{entry.into}.bias" for entry in plan.bias_correction.entries}
    report = qinsight.diagnose(model, calibration, deploy="xnnpack", verify=False).with_plan(plan)
    path = tempfile.mkstemp(suffix=".json")[1]
    qinsight.save_report(report, path)
    loaded = qinsight.load_report(path).plan
    assert loaded is not None and loaded.bias_correction == plan.bias_correction
    assert [c.kinds for c in loaded.checks] == [c.kinds for c in plan.checks] and loaded.checks[0].kept
    assert "biases corrected in" in qinsight.to_text(report)


def test_a_bias_correction_that_scores_worse_is_measured_and_left_out() -> None:
    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(10)
    plan = qinsight.plan(
        model, batches[:6], batches[6:], goal="sqnr>=44", deploy="x86", repairs=Repairs(bias_correction=True)
    )
    check = next(c for c in plan.checks if SuggestionKind.BIAS_CORRECTION in c.kinds)
    # FX on this model: 43.19 dB corrected against 43.37 without, measured for real
    assert not check.kept and check.alone < check.before and check.why is NoteKind.HURTS
    assert not plan.bias_correction.entries and qinsight.bias_corrected(model, plan) is model


def test_the_former_smoothing_keyword_is_a_repair_for_one_release_and_repairs_are_checked() -> None:
    model, data = example("cnn").model(), example("cnn").data(4)
    with pytest.warns(DeprecationWarning, match=r"plan\(smoothing=...\) is now plan\(repairs=...\)"):
        qinsight.plan(model, data[:2], data[2:], goal="sqnr>=20", smoothing=False)
    with pytest.raises(qinsight.errors.InvalidParameterError, match="None beside smoothing="):
        qinsight.plan(model, data[:2], data[2:], goal="sqnr>=20", repairs=Repairs(), smoothing=True)
    with pytest.raises(qinsight.errors.InvalidParameterError, match="Repairs: bias_correction='yes' is invalid"):
        Repairs(bias_correction="yes")  # type: ignore[arg-type]
    with pytest.raises(qinsight.errors.InvalidParameterError, match="a qinsight.types.Repairs"):
        qinsight.plan(model, data[:2], data[2:], goal="sqnr>=20", repairs=True)  # type: ignore[arg-type]
