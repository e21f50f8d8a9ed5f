"""FormatDetector (``qinsight.formats``): each Linear's weight in torchao's formats, measured from the weight
and checked against the weights ``quantize_`` really stores, and its input under per-token int8."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import qinsight
from qinsight.core.errors import InvalidParameterError
from qinsight.detectors.weight_formats import FormatDetector, FormatFinding
from qinsight.observe.format_errors import format_errors
from qinsight.plugin.discovery import DEFAULT_IDS

FORMATS = ("float8", "int4_g128", "int4_g32", "int8")


class Stack(nn.Module):
    """Four Linears of 256 inputs; ``wide`` has a few input columns 30x the rest (int4's groups of 32
    share a scale with them), ``loud`` reads an input whose channel 3 is 200x the others on every token."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.wide, self.loud, self.last = (nn.Linear(256, 256) for _ in range(4))
        with torch.no_grad():
            self.wide.weight[:, ::32] *= 30.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.wide(torch.relu(self.first(x)))
        loud = x.clone()
        loud[..., 3] = 200.0 * loud[..., 3].abs() + 200.0
        return self.last(torch.relu(self.loud(loud)))  # type: ignore[no-any-return]


def _findings(model: nn.Module, data: list[torch.Tensor]) -> dict[str, FormatFinding]:
    report = qinsight.diagnose(model, data, detectors=["qinsight.formats"], verify=False)
    return {f.fqn: f for f in report.result("qinsight.formats").findings if isinstance(f, FormatFinding)}


def test_each_weights_sqnr_is_what_quantize_stores() -> None:
    """Differential: the SQNR the detector measured from the float weight, against compare_weights on the
    model quantized by torchao's quantize_ in each format."""
    quantization = pytest.importorskip("torchao.quantization")
    model = Stack().eval()
    findings = _findings(model, [torch.randn(4, 8, 256) for _ in range(2)])
    for name in FORMATS:
        quantized = copy.deepcopy(model)
        quantization.quantize_(quantized, qinsight.fqn_to_config({fqn: name for fqn in findings}), filter_fn=None)
        weights = qinsight.compare_weights(model, quantized)
        for fqn, finding in findings.items():
            ours = next(e.sqnr for e in finding.errors if e.format == name)
            assert ours == pytest.approx(weights.layer(fqn).metric("sqnr"), abs=1e-3), (fqn, name)


def test_the_layer_a_format_loses_most_on_and_the_input_per_token_int8_starves_are_named() -> None:
    model = Stack().eval()
    findings = _findings(model, [torch.randn(4, 8, 256) for _ in range(3)])
    wide, loud = findings["wide"], findings["loud"]
    assert wide.verdict == "weight loses most" and wide.actionable
    worst = wide.worst_format()
    assert worst is not None and worst[0] == "int8" and worst[1] > 10  # per-row scales: its 30x columns set every row's
    assert "int8 keeps" in wide.reason() and "dB under the median Linear's" in wide.reason()
    assert loud.verdict == "input starves per-token int8" and loud.widest_channel == 3 and loud.token_bits is not None
    assert loud.token_bits < 4 and loud.widest_ratio is not None and loud.widest_ratio > 100
    assert findings["first"].verdict == findings["last"].verdict == "typical"
    assert wide.severity() is not None and wide.severity() > findings["first"].severity()  # type: ignore[operator]


def test_int8_dynamic_really_hurts_where_the_detector_says_the_input_starves() -> None:
    """What the finding predicts, applied: the loud layer's local error under int8_dynamic is the model's worst."""
    pytest.importorskip("torchao.quantization")
    model, data = Stack().eval(), [torch.randn(4, 8, 256) for _ in range(2)]
    findings = _findings(model, data)
    quantized = qinsight.quantize(model, _plan_of(model, {fqn: "int8_dynamic" for fqn in findings}))
    local = {
        layer.fqn: layer.metric("sqnr", local=True)
        for layer in qinsight.compare_activations(model, quantized, data).layers
    }
    starved = [fqn for fqn, f in findings.items() if f.verdict == "input starves per-token int8"]
    assert starved == ["loud"] and min(local, key=local.__getitem__) == "loud"


def _plan_of(model: nn.Module, assignment: dict[str, str]) -> qinsight.FormatPlan:
    from qinsight.core.formats import CurvePoint, FormatPlan, LayerFormat

    layers = tuple(LayerFormat(fqn=fqn, format=name, parameters=1, bits=8.0) for fqn, name in assignment.items())
    point = CurvePoint(label="plan", mean_bits=8.0, state_bytes=0, score=0.0)
    return FormatPlan(
        formats=("int8_dynamic",),
        metric="sqnr",
        target=None,
        budget=None,
        reached=True,
        layers=layers,
        chosen=point,
        float_score=0.0,
    )


def test_it_is_opt_in_and_its_statistics_survive_a_file_and_a_merge(tmp_path: object) -> None:
    from pathlib import Path

    assert "qinsight.formats" not in DEFAULT_IDS
    model = Stack().eval()
    data = [torch.randn(4, 8, 256) for _ in range(4)]
    report = qinsight.diagnose(model, data, detectors=["qinsight.formats"], verify=False)
    path = Path(str(tmp_path)) / "r.json"
    qinsight.save_report(report, path)
    assert qinsight.load_report(path) == report
    halves = [
        qinsight.diagnose(
            model, data, detectors=["qinsight.formats"], verify=False, shard=qinsight.types.Shard(rank=i, world_size=2)
        )
        for i in (0, 1)
    ]
    merged = qinsight.merge_reports(halves)
    assert {f.fqn: f.errors for f in merged.result("qinsight.formats").findings} == {  # type: ignore[attr-defined]
        f.fqn: f.errors
        for f in report.result("qinsight.formats").findings  # type: ignore[attr-defined]
    }


def test_a_bad_format_name_is_one_error() -> None:
    with pytest.raises(InvalidParameterError, match="formats="):
        FormatDetector(formats=("int8", "int3"))


weights = st.tuples(st.integers(1, 6), st.sampled_from((32, 64, 128))).flatmap(
    lambda shape: st.lists(
        st.floats(-1e3, 1e3, allow_subnormal=False), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]
    ).map(lambda values: torch.tensor(values, dtype=torch.float32).reshape(shape))
)


@settings(deadline=None, max_examples=60)
@given(weights, st.integers(-8, 8))
def test_a_weights_errors_do_not_depend_on_its_scale_and_int4s_grid_lies_inside_int8s(
    weight: torch.Tensor, power: int
) -> None:
    """Scaled by a power of two, every format's SQNR is the same; a row's int4 levels (amax/7.5 apart)
    are every 17th of its int8 levels (amax/127.5), so int8 per row never does worse than int4 per row."""
    names = ("int8", "float8", "int4_g32", f"int4_g{weight.shape[1]}")
    errors = {e.format: e.sqnr for e in format_errors(weight, names)}
    scaled = {e.format: e.sqnr for e in format_errors(weight * 2.0**power, names)}
    assert errors.keys() == scaled.keys() == set(names)
    for name in names:
        assert errors[name] == scaled[name] or (math.isnan(errors[name]) and math.isnan(scaled[name]))
    per_row = errors[f"int4_g{weight.shape[1]}"]
    assert errors["int8"] >= per_row - 1e-9 or math.isnan(per_row)
