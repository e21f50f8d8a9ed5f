"""plan(..., backend="xnnpack", lowered=True): a PT2E plan through XNNPACKQuantizer whose every real score
is of the program ExecuTorch runs, and which says so."""

from __future__ import annotations

import pytest
import torch

import qinsight
from qinsight.examples.builtin import example


def _cnn() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    chosen = example("cnn")
    return chosen.model(), chosen.data(12)


@pytest.mark.parametrize(
    "arguments,message",
    [
        (
            {"flow": "fx", "lowered": True},
            "plan: lowered=True is invalid; expected flow='pt2e' (the fx flow's model is not lowered)",
        ),
        ({"flow": "fx", "backend": "xnnpack"}, "for flow='fx' (xnnpack is served by flow='pt2e')"),
        ({"backend": "onednn", "lowered": True}, "expected flow='pt2e' (the fx flow's model is not lowered)"),
    ],
)
def test_a_plan_that_cannot_be_lowered_is_one_error_before_any_forward(
    arguments: dict[str, object], message: str
) -> None:
    model, batches = _cnn()
    with pytest.raises(qinsight.errors.InvalidParameterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        qinsight.plan(model, batches[:2], batches[2:4], **arguments)  # type: ignore[arg-type]


def test_a_speed_bound_without_a_lowered_program_is_one_error_before_any_forward() -> None:
    model, batches = _cnn()
    goal = qinsight.types.Goal(target="sqnr>=30", speed="speedup>=1.5")
    with pytest.raises(qinsight.errors.InvalidParameterError, match=r"lowered=True\): only a lowered program is timed"):
        qinsight.plan(model, batches[:2], batches[2:4], goal=goal, deploy="xnnpack")


@pytest.mark.slow
def test_a_lowered_xnnpack_plan_scores_times_and_sizes_the_program_executorch_runs() -> None:
    """The plan's verified score is the lowered program's own SQNR against fp32, as compare_lowered
    measures it on the same batches; the reference model's differs (43.18 against 43.17 dB here). Its
    program, the default's and the float model's are timed and sized, the sizes those compare_lowered
    reads; a speed bound the program cannot reach leaves the plan unreached, saying by how much."""
    pytest.importorskip("executorch")
    model, batches = _cnn()
    calibration, evaluation, held_out = batches[:6], batches[6:9], batches[9:]
    plan = qinsight.plan(
        model,
        calibration,
        evaluation,
        goal=qinsight.types.Goal(target="sqnr>=40", speed="speedup>=1000"),
        deploy=qinsight.types.Deployment(backend="xnnpack", lowered=True),
        held_out_data=held_out,
    )
    assert plan.flow == "pt2e" and plan.verified_score >= 40 and plan.held_out_score >= 40
    assert not plan.reached and str(plan.speed) == "speedup>=1000"
    assert plan.lowered.startswith("ExecuTorch ") and plan.lowered.endswith("runtime, XNNPACK delegate")
    shipped = qinsight.compare_lowered(model, qinsight.quantize(model, plan, calibration), evaluation, layers=False)
    assert plan.verified_score == pytest.approx(shipped.metric("lowered_vs_float"), abs=1e-6)
    assert plan.verified_score != shipped.metric("reference_vs_float")
    programs = plan.programs
    assert programs is not None and shipped.program is not None and shipped.float_program is not None
    assert programs.planned.size_bytes == shipped.program.size_bytes < programs.float_model.size_bytes
    assert programs.float_model.size_bytes == shipped.float_program.size_bytes
    assert programs.speedup == pytest.approx(programs.float_model.latency_ms / programs.planned.latency_ms)
    missed = [note for note in plan.notes if note.kind is qinsight.types.NoteKind.SPEED_MISSED]
    assert len(missed) == 1 and f"{programs.speedup:.2f}x the float program's speed" in missed[0].text
    assert plan.cost is not None and "float program" in [stage.stage for stage in plan.cost.stages]
    text = qinsight.to_text(qinsight.diagnose(model, calibration, verify=False).with_plan(plan))
    assert f"quantized for real and lowered ({plan.lowered})" in text
    assert "target sqnr>=40 and speedup>=1000 NOT reached" in text and "  program: the program runs " in text
