"""Smoothing (SmoothQuant factors chosen by measured error): the smoothed model computes what the
model did, its names follow one rule, the chosen factors lower the error of the real kernels, and a
plan made with it is applied as a user would in both flows."""

from __future__ import annotations

import copy

import pytest
import torch
from _checks import warns_note
from _peers import outputs, sqnr
from torch import nn

import qinsight
from qinsight import SmoothingMapping
from qinsight.apply.smoothed_model import SmoothedLinear, apply_smoothing
from qinsight.core.sites import OpKind
from qinsight.errors import InvalidParameterError
from qinsight.planning.smoothing_search import ALPHAS, choose_smoothing
from qinsight.types import NoteKind, Repairs, SmoothingEntry


class WideChannels(nn.Module):
    """A Linear reading a few channels 40x wider than the rest (a transformer's LayerNorm output
    looks so), then a ReLU and a second Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.up(x)))
        return out


def wide_batches(count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    widths = torch.ones(64)
    widths[:4] = 40.0
    return [torch.randn(8, 16, 64, generator=g) * widths for _ in range(count)]


@pytest.fixture(scope="module")
def wide() -> tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(0)
    return WideChannels().eval(), wide_batches(4, 0), wide_batches(4, 1)


def test_the_wide_input_is_smoothed_by_measurement_and_the_plain_one_barely(
    wide: tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]],
) -> None:
    model, calibration, _ = wide
    mapping = choose_smoothing(model, calibration, ["up", "down"], activation_bits=7)
    up = next(entry for entry in mapping.entries if entry.fqn == "up")
    assert up.alpha in ALPHAS and up.alpha > 0.0
    assert up.sqnr_after - up.sqnr_before > 10.0  # measured: 25.4 -> 36.2 dB (alpha 0.7)
    assert len(up.factors) == 64 and min(up.factors[:4]) > 5 * max(
        up.factors[4:]
    )  # the wide channels divided most: 53.9 vs <= 5.2
    plain = [entry for entry in mapping.entries if entry.fqn == "down"]
    assert all(entry.sqnr_after - entry.sqnr_before < 1.0 for entry in plain)


def test_a_smoothed_model_computes_what_the_model_did_under_names_that_follow_one_rule(
    wide: tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]],
) -> None:
    model, calibration, held_out = wide
    mapping = choose_smoothing(model, calibration, ["up"], activation_bits=7)
    smoothed = apply_smoothing(model, mapping)
    assert isinstance(smoothed.up, SmoothedLinear) and type(model.up) is nn.Linear  # a copy: the model is untouched
    assert sqnr(outputs(model, held_out), outputs(smoothed, held_out)) > 100.0  # float: the same function
    report = qinsight.diagnose(smoothed, calibration)
    kinds = {site.fqn: site.kind for site in report.sites}
    assert kinds["up.linear"] is OpKind.LINEAR and kinds["up.mul#0"] is OpKind.MUL  # what the plan names
    assert apply_smoothing(model, SmoothingMapping()) is model


def test_the_chosen_factors_lower_the_error_of_fbgemms_real_dynamic_linear(
    wide: tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]],
) -> None:
    """The choice emulates the kernel; the kernel itself, on data the choice never saw, agrees."""
    from torch.ao.quantization import QConfigMapping, per_channel_dynamic_qconfig
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    model, calibration, held_out = wide
    mapping = choose_smoothing(model, calibration, ["up"], activation_bits=7)

    def dynamic(float_model: nn.Module) -> nn.Module:
        qconfigs = QConfigMapping().set_object_type(nn.Linear, per_channel_dynamic_qconfig)
        return convert_fx(prepare_fx(copy.deepcopy(float_model), qconfigs, (calibration[0],)))

    reference = outputs(model, held_out)
    plain, smoothed = (
        sqnr(reference, outputs(dynamic(model), held_out)),
        sqnr(reference, outputs(dynamic(apply_smoothing(model, mapping)), held_out)),
    )
    assert smoothed > plain + 5.0  # measured: 25.1 -> 34.4 dB


def test_what_cannot_be_smoothed_is_refused_before_anything_is_copied(
    wide: tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]],
) -> None:
    model = wide[0]

    def entry(fqn: str, channels: int) -> SmoothingEntry:
        return SmoothingEntry(fqn=fqn, alpha=0.5, factors=(1.0,) * channels, sqnr_before=20.0, sqnr_after=30.0)

    with pytest.raises(InvalidParameterError, match=r"fqn='nothing \(no module\)'"):
        apply_smoothing(model, SmoothingMapping(entries=(entry("nothing", 64),)))
    with pytest.raises(InvalidParameterError, match=r"'7 factors'.*64, its input channels"):
        apply_smoothing(model, SmoothingMapping(entries=(entry("up", 7),)))
    with pytest.raises(InvalidParameterError, match=r"WideChannels"):
        apply_smoothing(model, SmoothingMapping(entries=(entry("", 64),)))
    with pytest.raises(InvalidParameterError, match=r"fqn=' \(Linear\)'"):  # a bare Linear is the model itself
        apply_smoothing(nn.Linear(64, 2), SmoothingMapping(entries=(entry("", 64),)))
    with pytest.raises(ValueError, match="positive and finite"):
        SmoothingEntry(fqn="up", alpha=0.5, factors=(1.0, 0.0), sqnr_before=1.0, sqnr_after=2.0)
    with pytest.raises(ValueError, match="once; repeated"):
        SmoothingMapping(entries=(entry("up", 64), entry("up", 64)))


@pytest.mark.slow
@pytest.mark.parametrize("flow", ["fx", "pt2e"])
def test_a_smoothed_plan_applied_as_a_user_would_scores_what_it_says(
    wide: tuple[nn.Module, list[torch.Tensor], list[torch.Tensor]], flow: str
) -> None:
    """The plan's config is for the smoothed model: smoothing then prepare/calibrate/convert, as the
    docs say, reproduces the plan's score; without smoothing the same target keeps ``up`` in float."""
    if flow == "pt2e":
        pytest.importorskip("torchao")
    model, calibration, held_out = wide
    plain = qinsight.plan(model, calibration, held_out, goal="sqnr>=33", deploy=flow)
    plan = qinsight.plan(model, calibration, held_out, goal="sqnr>=33", deploy=flow, repairs=Repairs(smoothing=True))
    assert plain.reached and plain.kept_float == ("up",) and plain.quantized_fraction == pytest.approx(0.2)
    # measured: FX 34.6 dB, PT2E 33.7 dB, every weight int8; the smoothing multiplications stay float
    assert plan.reached and plan.quantized_fraction == 1.0 and "up" in plan.smoothing.fqns
    assert plan.kept_float == () and "up.linear" in {
        s.fqn for s in plan.sensitivities
    }  # named as in the smoothed model
    # the divisions the flow would quantize are kept float and not searched (PT2E quantizes only up's)
    assert "up.mul#0" in {s.fqn for s in plan.suggestions if s.keep_float} <= set(plan.smoothing.divisions)
    assert not {"up.mul#0", "down.mul#0"} & {s.fqn for s in plan.sensitivities}
    assert plan.default_score == pytest.approx(plain.default_score)  # the model as given: 23.3 dB FX, 29.6 PT2E
    assert f"smoothed the inputs of {len(plan.smoothing)} Linears" in qinsight.to_text(plan)
    assert _applied(model, plan, calibration, held_out, flow) == pytest.approx(plan.verified_score, abs=1e-4)


def _applied(
    model: nn.Module, plan: qinsight.QuantPlan, calibration: list[torch.Tensor], held_out: list[torch.Tensor], flow: str
) -> float:
    """The plan's config taken as a user takes it from the report of the model as given, which says it
    is for the smoothed model; applied to that."""
    report = qinsight.diagnose(model, calibration).with_plan(plan)
    smoothed = qinsight.smoothed(model, plan)
    if flow == "fx":
        from _peers import quantize

        with warns_note(NoteKind.SMOOTHED_MODEL):
            mapping = qinsight.qconfig_mapping(report)
        quantized = quantize(smoothed, mapping, calibration)
    else:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        with warns_note(NoteKind.SMOOTHED_MODEL):
            quantizer = qinsight.pt2e_quantizer(report)
        exported = torch.export.export(smoothed, (calibration[0],)).module()
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            for batch in calibration:
                prepared(batch)
        quantized = convert_pt2e(prepared)
    return sqnr(outputs(model, held_out), outputs(quantized, held_out))
