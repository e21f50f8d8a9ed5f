"""Bias correction: measured as a brute-force measurement would, applied where the flow folds it, verified."""

from __future__ import annotations

import copy
import math

import attrs
import pytest
import torch
from _data import photo_crops
from _peers import sqnr
from _real import mobilenet_v2_or_skip
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import qinsight
from qinsight.apply.bias_correction import measure_bias_correction, shrunk_mean
from qinsight.apply.corrected_model import apply_bias_correction
from qinsight.apply.recipe import quantize_with
from qinsight.compare.layers import quantized_layers
from qinsight.core.advice import Advice
from qinsight.core.bias import BiasCorrection, BiasShift
from qinsight.core.errors import InvalidParameterError, InvalidValueError
from qinsight.core.verification import SuggestionKind
from qinsight.examples.builtin import example
from qinsight.frontends import model_structure


def _outputs_of(model: nn.Module, names: list[str], batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each named module's output, channel means over every sample and position of ``batches``."""
    found: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    hooks = [
        model.get_submodule(name).register_forward_hook(
            lambda _m, _a, out, name=name: found[name].append(out.double().movedim(1, -1).reshape(-1, out.shape[1]))
        )
        for name in names
    ]
    with torch.no_grad():
        for batch in batches:
            model(batch)
    for hook in hooks:
        hook.remove()
    return {name: torch.cat(values).mean(0) for name, values in found.items()}


@pytest.mark.parametrize(("flow", "backend"), [("fx", "fbgemm"), ("pt2e", "xnnpack")])
def test_the_local_shift_is_what_each_quantized_weight_alone_moves_its_output_by(flow: str, backend: str) -> None:
    """Differential: per layer, the float model with that layer's weight alone replaced by the one the
    flow computes with (unfolded from its BatchNorm), run on the batches: its output's mean moves by
    exactly the measured shift."""
    cnn = example("cnn")
    model, batches = cnn.model().eval(), cnn.data(4)
    advice = Advice(flow=flow, backend=backend)  # type: ignore[arg-type]
    local = measure_bias_correction(model, advice, batches, shrink=False)
    assert local.fqns == ("conv1", "block.0", "fc")
    converted = quantize_with(model, advice, batches)
    weights = {fqn: layer.weight().detach() for fqn, layer in quantized_layers(model, converted).items()}
    folds = model_structure(model).batchnorm_after_conv()
    reference = _outputs_of(model, [entry.into for entry in local.entries], batches)
    for entry in local.entries:
        brute = copy.deepcopy(model)
        layer = brute.get_submodule(entry.fqn)
        scale = torch.ones(layer.weight.shape[0])
        if entry.fqn in folds:
            bn = brute.get_submodule(folds[entry.fqn])
            scale = bn.weight.detach() * torch.rsqrt(bn.running_var + bn.eps)
            assert entry.into == folds[entry.fqn]
        with torch.no_grad():
            layer.weight.copy_(weights[entry.fqn] / scale.reshape(-1, *[1] * (layer.weight.dim() - 1)))
        moved = _outputs_of(brute, [entry.into], batches)[entry.into] - reference[entry.into]
        assert torch.tensor(entry.shift, dtype=torch.float64) == pytest.approx(moved, abs=1e-6, rel=1e-4)
        assert entry.size > 0


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=1, max_value=5),
    st.floats(min_value=-3, max_value=3),
    st.floats(min_value=0.0, max_value=2.0),
    st.integers(min_value=0, max_value=2**16),
)
def test_a_shrunk_mean_is_the_mean_pulled_toward_zero_by_its_noise(
    samples: int, channels: int, centre: float, noise: float, seed: int
) -> None:
    values = centre + noise * torch.randn(samples, channels, generator=torch.Generator().manual_seed(seed))
    values = values.double()
    shrunk, mean = shrunk_mean(values), values.mean(0)
    if samples < 2:
        assert torch.equal(shrunk, torch.zeros(channels, dtype=torch.float64))  # one sample: no noise to judge by
        return
    assert torch.all(shrunk.abs() <= mean.abs() + 1e-12)
    assert torch.all((shrunk == 0) | (torch.sign(shrunk) == torch.sign(mean)))
    if noise == 0.0:
        assert shrunk == pytest.approx(mean)  # nothing to doubt
    t_squared = (mean.square() / (values.var(0) / samples)).nan_to_num(posinf=1e300)
    if channels > 2 and float(t_squared.sum()) <= channels - 2:
        assert torch.all(shrunk == 0)  # the channels stand no further out of their noise than chance: no shift
    elif channels <= 2:
        assert torch.all(shrunk[t_squared <= 1] == 0)


def test_a_verified_report_corrects_the_biases_and_quantize_applies_them() -> None:
    cnn = example("cnn")
    model, batches = cnn.model().eval(), cnn.data(8)
    report = qinsight.diagnose(model, batches, deploy="xnnpack")
    verdict = report.verification_for("pt2e")
    assert verdict is not None and verdict.verified
    check = next(c for c in verdict.checks if c.kind is SuggestionKind.BIAS_CORRECTION)
    assert 0 < check.modules == len(verdict.bias_correction) <= 3  # the layers whose shift stood out of its noise
    assert verdict.applied_bias_correction == (verdict.bias_correction if check.kept else BiasCorrection())
    # what the user runs scores what the verdict says, on the batches it was scored on
    calibrating, scored = batches[:6], batches[6:]
    quantized = qinsight.quantize(model, report, calibrating)
    with torch.no_grad():
        reference = torch.cat([model(b) for b in scored])
        assert verdict.score == pytest.approx(sqnr(reference, torch.cat([quantized(b) for b in scored])), abs=1e-4)
    corrected = qinsight.bias_corrected(model, report)
    moved = {name for name, value in corrected.state_dict().items() if not torch.equal(value, model.state_dict()[name])}
    assert moved == ({f"{e.into}.bias" for e in verdict.bias_correction.entries} if check.kept else set())
    text = qinsight.to_text(report)
    assert (f"biases corrected in {check.modules} layers" in text) == check.kept and (check.reason in text)
    loaded = qinsight.load_report(_saved(report))
    assert loaded.verification_for("pt2e") == verdict


def _saved(report: qinsight.Report) -> str:
    import tempfile

    path = tempfile.mkstemp(suffix=".json")[1]
    qinsight.save_report(report, path)
    return path


def test_bias_corrections_that_do_not_fit_the_model_are_one_error_each() -> None:
    model = example("cnn").model()
    with pytest.raises(InvalidValueError, match="each bias may be corrected once"):
        BiasCorrection(entries=(BiasShift(fqn="a", into="b", shift=(0.1,), size=0.0),) * 2)
    with pytest.raises(InvalidValueError, match="finite"):
        BiasShift(fqn="a", into="a", shift=(math.nan,), size=0.0)
    wrong = BiasCorrection(entries=(BiasShift(fqn="fc", into="relu1", shift=(0.1,) * 10, size=0.1),))
    with pytest.raises(InvalidParameterError, match="relu1 \\(ReLU\\)"):
        apply_bias_correction(model, wrong)
    short = BiasCorrection(entries=(BiasShift(fqn="fc", into="fc", shift=(0.1,) * 3, size=0.1),))
    with pytest.raises(InvalidParameterError, match="10, its output channels"):
        apply_bias_correction(model, short)
    no_bias = nn.Sequential(nn.Linear(4, 3, bias=False))
    added = apply_bias_correction(
        no_bias, BiasCorrection(entries=(BiasShift(fqn="0", into="0", shift=(1.0, -2.0, 0.5), size=0.1),))
    )
    assert no_bias[0].bias is None and added[0].bias.tolist() == [-1.0, 2.0, -0.5]


@pytest.mark.slow
def test_mobilenet_v2_for_x86_keeps_every_layer_int8_and_its_corrected_biases_hold_on_other_photos() -> None:
    """Real weights: XNNPACK's and x86's int8 weights lean in MobileNetV2's depthwise convs. Calibrated on
    crops of one photo, the x86 report's verified config corrects its biases, and on crops of two photos
    it never saw it scores above the flow's default, every layer still int8."""
    pytest.importorskip("sklearn")
    model = mobilenet_v2_or_skip().eval()
    calibration = photo_crops(16, seed=1)
    unseen = photo_crops(32, seed=3, photos=("china", "flower"))
    report = qinsight.diagnose(model, calibration, deploy="x86", verify="pt2e")
    verdict = report.verification_for("pt2e")
    assert verdict is not None and verdict.verified and not verdict.left_float
    check = next(c for c in verdict.checks if c.kind is SuggestionKind.BIAS_CORRECTION)
    assert check.kept and verdict.score > check.without
    assert len(verdict.applied_bias_correction) > 40  # of MobileNetV2's 53 layers
    offered = qinsight.advice_of(report, "pt2e")
    configs = {
        "ours": qinsight.quantize(model, report, calibration, flow="pt2e"),
        "uncorrected": quantize_with(model, attrs.evolve(offered, bias_correction=BiasCorrection()), calibration),
        "default": quantize_with(model, Advice(flow="pt2e", backend="x86"), calibration),
    }
    with torch.no_grad():
        reference = torch.cat([model(b) for b in unseen])
        scores = {name: sqnr(reference, torch.cat([q(b) for b in unseen])) for name, q in configs.items()}
    assert scores["ours"] > max(scores["uncorrected"], scores["default"]) + 0.3, scores
