"""plan(..., quantizer=q): the plan starts from the user's own PT2E quantizer and only chooses what to
keep in float on top of it; applied again with that quantizer, it scores what the plan says."""

from __future__ import annotations

import pytest
import torch

import qinsight
from qinsight.compare.metric_functions import sqnr
from qinsight.compare.outputs import output_rows
from qinsight.examples.builtin import example
from qinsight.types import NoteKind

pytest.importorskip("executorch")

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (  # noqa: E402
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)


def test_a_quantizer_a_plan_cannot_start_from_is_one_error_before_any_forward() -> None:
    from torch.ao.quantization import get_default_qconfig_mapping

    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(4)
    with pytest.raises(
        qinsight.errors.InvalidParameterError, match="plan: quantizer='QConfigMapping' is invalid; expected a torchao"
    ):
        qinsight.plan(
            model, batches[:2], batches[2:], quantizer=get_default_qconfig_mapping("x86")
        )  # the former keyword
    with pytest.raises(qinsight.errors.InvalidParameterError, match="plan: quantizer='XNNPACKQuantizer' is invalid"):
        qinsight.plan(
            model, batches[:2], batches[2:], deploy=qinsight.types.Deployment(flow="fx", quantizer=XNNPACKQuantizer())
        )


@pytest.mark.slow
def test_a_plan_on_top_of_the_users_quantizer_keeps_float_only_what_it_must() -> None:
    """The built-in CNN under XNNPACKQuantizer's per-tensor config: 43.2 dB by default; for sqnr>=50 the
    plan keeps fc and the pool in float (94% of the weights quantized): 54.6 dB, 55.2 on held-out
    batches. Measured again here by quantizing with the user's quantizer and the plan."""
    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(12)
    calibration, evaluation, held_out = batches[:6], batches[6:9], batches[9:]
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False))
    plan = qinsight.plan(
        model,
        calibration,
        evaluation,
        goal="sqnr>=50",
        deploy=qinsight.types.Deployment(backend="xnnpack", quantizer=quantizer),
        held_out_data=held_out,
    )
    assert plan.flow == "pt2e" and plan.starts_from == "XNNPACKQuantizer" and plan.reached
    assert plan.default_score < 50.0 and 0.5 < plan.quantized_fraction < 1.0
    assert plan.suggestions and all(s.keep_float for s in plan.suggestions)  # the quantizer decides everything else
    assert any(check.why is NoteKind.YOURS_DECIDES for check in plan.checks if not check.kept)
    converted = qinsight.quantize(model, plan, calibration, quantizer=quantizer)
    with torch.no_grad():
        reference = torch.cat([output_rows(model(batch)) for batch in held_out])
        quantized = torch.cat([output_rows(converted(batch)) for batch in held_out])
    assert sqnr(reference, quantized) == pytest.approx(plan.held_out_score, abs=1e-6)
    report = qinsight.diagnose(model, calibration, verify=False).with_plan(plan)
    assert "on top of your XNNPACKQuantizer" in qinsight.to_text(report)
    with pytest.raises(
        qinsight.errors.InvalidParameterError, match="expected the XNNPACKQuantizer the plan started from"
    ):
        qinsight.quantize(model, plan, calibration)
