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


@pytest.mark.slow
def test_a_lowered_xnnpack_plan_scores_the_program_executorch_runs() -> None:
    """The plan's verified score is the lowered program's own SQNR against fp32, as compare_lowered
    measures it on the same batches; the reference model's differs (43.18 against 43.17 dB here)."""
    pytest.importorskip("executorch")
    model, batches = _cnn()
    calibration, evaluation, held_out = batches[:6], batches[6:9], batches[9:]
    plan = qinsight.plan(
        model,
        calibration,
        evaluation,
        goal="sqnr>=40",
        deploy=qinsight.types.Deployment(backend="xnnpack", lowered=True),
        held_out_data=held_out,
    )
    assert plan.flow == "pt2e" and plan.reached
    assert plan.lowered.startswith("ExecuTorch ") and plan.lowered.endswith("runtime, XNNPACK delegate")
    shipped = qinsight.compare_lowered(
        model, qinsight.quantize(model, plan, calibration), evaluation, layers=False, float_program=False
    )
    assert plan.verified_score == pytest.approx(shipped.metric("lowered_vs_float"), abs=1e-6)
    assert plan.verified_score != shipped.metric("reference_vs_float")
    assert f"quantized for real and lowered ({plan.lowered})" in qinsight.to_text(
        qinsight.diagnose(model, calibration, verify=False).with_plan(plan)
    )
