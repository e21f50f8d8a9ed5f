"""The report verifies its own config (issue: advice that cannot hurt): quantized for real at diagnosis,
each kind of suggestion that lowers the score dropped with its numbers. Judged as a user would: the
report's config quantized with ``qinsight.quantize`` and scored on inputs no calibration saw."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _data import photo_crops, sentence_batches
from _models import DataDependent, ShapeBranching, Stream
from _peers import sqnr
from _real import minilm_or_skip, mobilenet_v2_or_skip
from torch import nn

import qinsight
from qinsight.compare.outputs import output_rows
from qinsight.core.sites import OpKind
from qinsight.core.suggestions import ActivationMode
from qinsight.core.verification import SuggestionKind
from qinsight.examples.builtin import example
from qinsight.frontends import run_batch
from qinsight.outputs.html import render_html
from qinsight.types import NoteKind


def outputs(model: nn.Module, batches: list[Any]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([output_rows(run_batch(model, batch)) for batch in batches])


def unseen_scores(
    model: nn.Module, report: qinsight.Report, flow: str, calibration: list[Any], unseen: list[Any]
) -> tuple[float, float]:
    """The report's config and the flow's default (the same sites, nothing suggested), each quantized as
    a user would on ``calibration``, scored on ``unseen`` batches against the float model."""
    reference = outputs(model.eval(), unseen)
    default = qinsight.Advice(flow=flow, backend=report.metadata.backend, sites=report.sites)  # type: ignore[arg-type]
    ours = qinsight.quantize(model, report, calibration, flow=flow)  # type: ignore[arg-type]
    theirs = qinsight.quantize(model, default, calibration)
    return sqnr(reference, outputs(ours, unseen)), sqnr(reference, outputs(theirs, unseen))


def test_torchs_equalization_that_hurts_a_conv_bn_net_is_dropped_with_its_numbers() -> None:
    cnn = example("cnn")
    model, batches = cnn.model(), cnn.data(12)
    calibration, unseen = batches[:8], batches[8:]
    unverified = qinsight.diagnose(model, calibration, verify=False)
    assert unverified.equalization_mapping.fqns == ("fc",)  # the detector asks for it
    report = qinsight.diagnose(model, calibration, verify="fx")

    verdict = report.verification_for("fx")
    assert verdict is not None and verdict.verified and verdict.held_out
    assert (verdict.calibrated, verdict.scored) == (6, 2)
    assert verdict.dropped == (SuggestionKind.EQUALIZE,)
    check = next(c for c in verdict.checks if c.kind is SuggestionKind.EQUALIZE)
    assert check.without > verdict.suggested + 10  # measured: 43.7 dB without it, 25.9 dB with it
    assert check.why is NoteKind.HURTS
    bias = next(c for c in verdict.checks if c.kind is SuggestionKind.BIAS_CORRECTION)
    assert bias.without == check.without >= verdict.default  # the config without equalization, then its biases
    assert verdict.score > check.without if bias.kept else verdict.score == check.without
    code = "\n".join(qinsight.config_code(report))
    assert ("model = qinsight.bias_corrected(model, report)" in code) == bias.kept
    # the one-step outputs follow: no equalization left to apply, the reason kept
    assert report.equalization_mapping.fqns == () and report.equalization_mapping.refused[0].reason == check.reason
    assert not qinsight.advice_of(report, "fx").equalization.entries and qinsight.advice_of(report, "fx").verified
    assert not qinsight.advice_of(unverified, "fx").verified

    verified_unseen, default_unseen = unseen_scores(model, report, "fx", calibration, unseen)
    as_suggested_unseen, _ = unseen_scores(model, unverified, "fx", calibration, unseen)
    assert verified_unseen >= default_unseen - 0.3
    assert verified_unseen > as_suggested_unseen + 10  # the equalization the detector asked for costs that much

    text = qinsight.to_text(report)
    assert verdict.describe() in text and "input-weight equalization (1 module): not applied" in text
    assert "Not verified" in qinsight.to_text(unverified)


def test_the_report_saved_carries_its_verification_and_applies_it_when_loaded(tmp_path: Any) -> None:
    cnn = example("cnn")
    report = qinsight.diagnose(cnn.model(), cnn.data(4), verify="fx")
    path = tmp_path / "report.json"
    qinsight.save_report(report, path)
    loaded = qinsight.load_report(path)
    assert loaded == report and loaded.verification == report.verification
    assert qinsight.advice_of(loaded, "fx") == qinsight.advice_of(report, "fx")
    page = render_html(loaded)
    assert '<p id="verification">Verified for real' in page and "<li>fx: the report&#x27;s config" in page


def test_the_default_verifies_the_frontends_flow_and_qinsight_verify_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    cnn = example("cnn")
    model, data = cnn.model(), cnn.data(2)
    monkeypatch.delenv("QINSIGHT_VERIFY", raising=False)
    assert [v.flow for v in qinsight.diagnose(model, data).verification] == ["fx"]
    # FX cannot quantize what it cannot trace: a model only the eager frontend reads is verified in the flows
    # that take it without FX's trace, PT2E (torch.export) and torchao (quantize_)
    assert [v.flow for v in qinsight.diagnose(model, data, frontend="eager").verification] == ["pt2e", "torchao"]
    monkeypatch.setenv("QINSIGHT_VERIFY", "0")
    assert qinsight.diagnose(model, data).verification == ()
    assert [v.flow for v in qinsight.diagnose(model, data, verify="fx").verification] == [
        "fx"
    ]  # a call's own word wins
    monkeypatch.setenv("QINSIGHT_VERIFY", "pt2e,fx")
    assert [v.flow for v in qinsight.diagnose(model, data).verification] == ["pt2e", "fx"]
    monkeypatch.setenv("QINSIGHT_VERIFY", "tflite")
    with pytest.raises(qinsight.errors.InvalidParameterError, match="QINSIGHT_VERIFY"):
        qinsight.diagnose(model, data)
    with pytest.raises(qinsight.errors.InvalidParameterError, match="verify"):
        qinsight.diagnose(model, data, verify="onnx")


def test_one_batch_is_calibrated_and_scored_on_itself_and_said_so() -> None:
    cnn = example("cnn")
    report = qinsight.diagnose(cnn.model(), cnn.data(1), verify="fx")
    verdict = report.verification[0]
    assert (verdict.calibrated, verdict.scored, verdict.held_out) == (1, 1, False)
    assert "on the calibration batch" in verdict.describe()


def test_a_config_the_flow_cannot_run_drops_the_kind_that_breaks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = example("encoder")
    model, data = encoder.model(), encoder.data(4)
    unverified = qinsight.diagnose(model, data, verify=False)
    assert any(s.keep_float for s in unverified.suggestions)
    from qinsight.apply import recipe

    real = recipe.quantize_with

    def breaks_on_float_sites(
        model: nn.Module, advice: qinsight.Advice, calibration: Any, quantizer: object = None, runs_on: Any = ()
    ) -> nn.Module:
        if any(s.keep_float for s in advice.suggestions):
            raise RuntimeError("promoteTypes with quantized numbers is not handled yet")  # what convert_fx gave MiniLM
        return real(model, advice, calibration, quantizer, runs_on)

    monkeypatch.setattr("qinsight.apply.trial.quantize_with", breaks_on_float_sites)
    verdict = qinsight.verify_report(model, unverified, data, flows="fx").verification[0]
    assert verdict.suggested == -math.inf and SuggestionKind.KEEP_FLOAT in verdict.dropped
    check = next(c for c in verdict.checks if c.kind is SuggestionKind.KEEP_FLOAT)
    assert check.why is NoteKind.FLOW_CANNOT_RUN and "promoteTypes" in check.reason  # torch's error, carried
    assert math.isfinite(verdict.score) and verdict.score >= verdict.default
    assert not any(s.keep_float for s in qinsight.advice_of(unverified.with_verification((verdict,)), "fx").suggestions)


def _builtin(name: str) -> tuple[nn.Module, list[Any], list[Any]]:
    chosen = example(name)
    batches = chosen.data(12)
    return chosen.model(), batches[:8], batches[8:]


def _digits() -> tuple[nn.Module, list[Any], list[Any]]:
    pytest.importorskip("sklearn")
    from qinsight.examples.digits import digits_cnn

    trained = digits_cnn()
    return trained.model, list(trained.train_images[:512].split(64)), list(trained.test_images[:256].split(64))


MODELS = {
    "cnn": lambda: _builtin("cnn"),
    "encoder": lambda: _builtin("encoder"),
    "resnet18": lambda: _builtin("resnet18"),
    "mobilenet_v2": lambda: (mobilenet_v2_or_skip(), photo_crops(32, seed=0), photo_crops(16, seed=1)),
    "minilm": lambda: (minilm_or_skip(), sentence_batches(8)[:4], sentence_batches(8)[4:]),
    "digits": _digits,
}


# Minutes on 2 cores of the models verified in the extended tier only: the built-in CNN, encoder and the
# trained digits CNN cover the whole suite's tier (MiniLM's verified reports: tests/models/test_whole_model.py).
EXTENDED = {"mobilenet_v2": 4, "resnet18": 2, "minilm": 2}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.extended(EXTENDED[name])] if name in EXTENDED else [])
        for name in sorted(MODELS)
    ],
)
def test_the_reports_config_scores_at_least_the_default_on_unseen_inputs(name: str) -> None:
    model, calibration, unseen = MODELS[name]()
    report = qinsight.diagnose(model, calibration, verify=("fx", "pt2e"))
    for verdict in report.verification:
        assert verdict.verified, verdict.error
        assert verdict.score >= verdict.default  # on the batches held out of the verification's calibration
        ours, default = unseen_scores(model, report, verdict.flow, calibration, unseen)
        assert ours >= default - 0.3, f"{verdict.flow}: {ours:.2f} dB against the default's {default:.2f} dB unseen"


def test_a_model_the_flow_leaves_float_is_said_in_one_line_read_from_the_converted_model() -> None:
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    model, batches = Stream().eval(), [torch.randn(4, 8, 20) for _ in range(4)]
    report = qinsight.diagnose(model, batches, verify=("pt2e", "fx"))
    pt2e, fx = report.verification_for("pt2e"), report.verification_for("fx")
    assert pt2e is not None and fx is not None
    assert pt2e.left_float == ("conv",) and math.isinf(pt2e.default)  # nothing quantized: the output is the float one
    assert NoteKind.LEFT_FLOAT in [note.kind for note in pt2e.notes]
    assert fx.left_float == () and math.isfinite(fx.default)  # FX does quantize the conv
    assert "quantizes none of this model's Conv1d layers" in qinsight.to_text(report)


def test_a_prepared_model_is_not_verified_and_says_why() -> None:
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import prepare_fx

    cnn = example("cnn")
    data = cnn.data(3)
    prepared = prepare_fx(cnn.model(), get_default_qconfig_mapping("x86"), (data[0],))
    verdict = qinsight.diagnose(prepared, data, verify="fx").verification[0]
    assert not verdict.verified and "prepared already" in verdict.error and "diagnose the float model" in verdict.error


# resnet18 takes half a minute on 2 cores: the extended tier
@pytest.mark.parametrize(
    "name", ["cnn", "encoder", pytest.param("resnet18", marks=[pytest.mark.slow, pytest.mark.extended(1)])]
)
def test_the_defaults_verify_every_built_in_example_in_its_own_flow(name: str) -> None:
    """What a user's first call does: ``diagnose`` with nothing but the model and data verifies the
    config for real, in FX for the module and in PT2E for its exported program."""
    chosen = example(name)
    model, data = chosen.model(), chosen.data(2)  # one batch calibrates, one is scored
    traced = qinsight.diagnose(model, data)
    exported = qinsight.diagnose(
        torch.export.export(model, tuple(data[0]) if isinstance(data[0], tuple) else (data[0],)), data
    )
    for report, flow in ((traced, "fx"), (exported, "pt2e")):
        assert [v.flow for v in report.verification] == [flow]
        verdict = report.verification[0]
        assert verdict.verified, verdict.error
        assert math.isfinite(verdict.score) and not verdict.error
        assert "Not verified" not in qinsight.to_text(report)


def test_a_model_fx_cannot_trace_is_verified_in_pt2e_by_default_and_its_config_speaks_pt2e() -> None:
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    model, data = ShapeBranching().eval(), [torch.randn(8, 16) for _ in range(4)]
    report = qinsight.diagnose(model, data)
    assert report.metadata.frontend == "eager"
    verdict = report.verification_for("pt2e")
    assert [v.flow for v in report.verification] == ["pt2e", "torchao"]
    assert verdict is not None and verdict.verified and math.isfinite(verdict.score) and verdict.score > 20.0
    assert not verdict.left_float  # both Linears quantized, read from the converted model
    # applied as its user would, the verified config quantizes both Linears through torch.export
    quantized = qinsight.quantize(model, report, data)
    layers = qinsight.compare_activations(model, quantized, data[:1]).layers
    assert {row.fqn for row in layers if row.quantized} == {"fc1", "fc2"}
    text = qinsight.to_text(report)
    assert (
        "Verified for real (qinsight.pt2e_quantizer(report) / qinsight.quantize(model, report, data, flow='torchao')"
        in text
    )
    assert "qinsight.qconfig_mapping(report)" not in text  # no FX mapping its user cannot apply
    assert "FX cannot trace this model; it quantizes through PT2E: <code>qinsight.pt2e_quantizer(report)</code>" in (
        render_html(report)
    )
    unverified = qinsight.diagnose(model, data, verify=False)
    assert unverified.verification == ()
    text = qinsight.to_text(unverified)
    assert "FX cannot trace this model (the eager frontend read it), so PT2E and torchao quantize_ verify it: " in text
    assert "qinsight.pt2e_quantizer(report) gives this config: FX cannot trace this model" in text


def test_a_model_torch_export_cannot_take_is_verified_by_quantize_and_pt2e_says_why_not() -> None:
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    model, data = DataDependent().eval(), [torch.randn(8, 4) for _ in range(4)]
    report = qinsight.diagnose(model, data)
    refused, verdict = report.verification_for("pt2e"), report.verification_for("torchao")
    assert report.metadata.frontend == "eager" and refused is not None and not refused.verified
    assert "cannot prepare DataDependent" in refused.describe() and "data-dependent" in refused.describe()
    assert "pt2e: not verified: " in qinsight.to_text(report)
    # quantize_ needs no graph: the config is verified there, its one Linear int8, read from the converted model
    assert verdict is not None and verdict.verified and verdict.score > 30.0 and not verdict.left_float
    # so the report's config, applied as its user would without naming a flow, is quantize_'s
    quantized = qinsight.quantize(model, report, data)
    assert "(torchao Int8Tensor)" in qinsight.compare_weights(model, quantized).layer("fc").quantized_type


def test_the_torchao_verdict_is_the_score_of_the_config_its_user_applies() -> None:
    """verify_report(flows="torchao") against the user's own steps: quantize(flow="torchao") on the first
    three quarters, scored on the held-out quarter; each static Linear's activation scale is the largest
    |input| calibration saw over 127, read from the converted model."""
    pytest.importorskip("torchao")
    encoder = example("encoder")
    model, data = encoder.model(), encoder.data(4)
    report = qinsight.verify_report(model, qinsight.diagnose(model, data, verify=False), data, flows="torchao")
    verdict = report.verification_for("torchao")
    assert verdict is not None and verdict.verified and (verdict.calibrated, verdict.scored) == (3, 1)
    quantized = qinsight.quantize(model, report, data[:3], flow="torchao")
    with torch.no_grad():
        assert verdict.score == pytest.approx(sqnr(model(data[3]), quantized(data[3])), abs=1e-4)
    linears = [site.fqn for site in report.sites if site.kind is OpKind.LINEAR]
    dynamic = {
        s.fqn for s in qinsight.advice_of(report, "torchao").suggestions if s.activation is ActivationMode.DYNAMIC
    }
    static = [fqn for fqn in linears if fqn not in dynamic]
    assert static and dynamic  # both kinds of Linear in this config
    largest = {fqn: torch.tensor(0.0) for fqn in static}
    model = qinsight.bias_corrected(model, report, "torchao")  # what quantize calibrated: the verified config's
    hooks = [
        model.get_submodule(fqn).register_forward_pre_hook(
            lambda _m, args, fqn=fqn: largest.__setitem__(fqn, torch.maximum(largest[fqn], args[0].abs().amax()))
        )
        for fqn in static
    ]
    with torch.no_grad():
        for batch in data[:3]:
            model(batch)
    for hook in hooks:
        hook.remove()
    for fqn in static:
        weight = quantized.get_submodule(fqn).weight
        assert "int8 static activations" in qinsight.compare_weights(model, quantized).layer(fqn).quantized_type
        assert float(weight.act_quant_scale.flatten()[0]) == pytest.approx(float(largest[fqn]) / 127, rel=1e-6)
