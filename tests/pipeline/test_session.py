"""diagnose() / instrument(): the model comes back as it was, bad input gets clear
errors or explicit findings, detectors fail alone, and results are deterministic."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Sequence

import pytest
import torch
from _checks import hooks_left
from _data import gaussian_batches
from _models import TwiceLinear, seeded
from _peers import prepared_fx
from torch import nn

import qinsight
from qinsight.core.report import DetectorResult
from qinsight.core.sites import InsertPoint, ObserverSpec
from qinsight.core.stats import ObservedStats
from qinsight.detectors import DynamicStaticDetector, DynamicStaticFinding, PerChannelDetector
from qinsight.errors import CalibrationError, FrontendError
from qinsight.types import DataCondition, FailureStage, Side


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("prepared", [False, True])
def test_model_is_unchanged(mlp: nn.Module, prepared: bool) -> None:
    data = gaussian_batches((8, 16), 5)
    model = prepared_fx(mlp, data[0]) if prepared else mlp
    model.train()
    before_state, before_out = snapshot(model), model(data[0])
    before_code = model.code if isinstance(model, torch.fx.GraphModule) else None
    qinsight.diagnose(model, data)
    assert hooks_left(model) == 0
    assert model.training and all(m.training for m in model.modules())
    after = model.state_dict()
    assert before_state.keys() == after.keys()
    assert all(torch.equal(before_state[k], after[k]) for k in before_state if "activation_post_process" not in k)
    assert torch.equal(before_out, model(data[0]))
    if before_code is not None:
        assert model.code == before_code


def test_calibration_error_removes_observers_and_names_the_batch(mlp: nn.Module) -> None:
    data: list[object] = [torch.randn(2, 16), torch.randn(2, 16), torch.randn(2, 5)]
    # The model's own error comes first; the per-channel input observer that saw the wrong width is named too.
    with pytest.raises(
        CalibrationError,
        match=r"calibration batch 2 failed: RuntimeError: .*\(and observer fc1:pre: a batch has 5 channels",
    ) as info:
        qinsight.diagnose(mlp, data)
    assert info.value.batch == 2
    assert hooks_left(mlp) == 0
    assert pickle.loads(pickle.dumps(info.value)).batch == 2


def test_prepared_model_nan_batch_fails_cleanly(mlp: nn.Module) -> None:
    # prepare_fx's HistogramObserver raises on NaN: the error names the batch and no observer stays behind.
    data = gaussian_batches((8, 16), 3)
    prepared = prepared_fx(mlp, data[0])
    data[1][0, 0] = float("nan")
    with pytest.raises(CalibrationError, match="calibration batch 1 failed"):
        qinsight.diagnose(prepared, data)
    assert hooks_left(prepared) == 0


def test_no_calibration_batches(mlp: nn.Module) -> None:
    with pytest.raises(CalibrationError, match="no calibration batches ran"):
        qinsight.diagnose(mlp, [])
    assert hooks_left(mlp) == 0


def test_nan_and_inf_batches_are_counted_not_propagated(mlp: nn.Module) -> None:
    data = gaussian_batches((8, 16), 6)
    data[2][1, 3] = float("nan")
    data[4][0, 0] = float("inf")
    report = qinsight.diagnose(mlp, data)
    pre = report.observation("fc1", Side.PRE)
    assert pre is not None
    assert (pre.stats.batches, pre.stats.nonfinite_batches) == (4, 2)
    finding = report.result("qinsight.dynamic_static").finding("fc1")
    assert isinstance(finding, DynamicStaticFinding)
    assert finding.input.statistic is not None and 0 < finding.input.statistic <= 1
    assert "fc1:pre: 2 of 6 batches held NaN/Inf" in qinsight.to_text(report)


def test_all_nan_data_is_a_no_data_finding(mlp: nn.Module) -> None:
    report = qinsight.diagnose(mlp, [torch.full((2, 16), float("nan"))] * 2)
    finding = report.result("qinsight.dynamic_static").finding("fc1")
    assert isinstance(finding, DynamicStaticFinding)
    assert finding.input.condition is DataCondition.NO_DATA
    assert finding.dynamic_recommended is None and finding.actionable
    assert "no finite activation reached it (2 batches with NaN/Inf)" in qinsight.to_text(report)
    suggestion = report.suggestion("fc1")
    assert suggestion is not None and suggestion.activation is None  # no verdict, no opinion


def test_all_zero_batch_is_counted(mlp: nn.Module) -> None:
    data = gaussian_batches((8, 16), 5)
    data[3] = torch.zeros(8, 16)
    report = qinsight.diagnose(mlp, data)
    pre = report.observation("fc1", Side.PRE)
    assert pre is not None and pre.stats.constant_batches == 1 and pre.stats.batches == 5


def test_batch_size_one(mlp: nn.Module) -> None:
    report = qinsight.diagnose(mlp, gaussian_batches((1, 16), 5))
    finding = report.result("qinsight.dynamic_static").finding("fc2")
    assert isinstance(finding, DynamicStaticFinding)
    assert finding.output.statistic is not None and 0 < finding.output.statistic <= 1


def test_module_called_twice_is_a_site_per_call() -> None:
    model, data = seeded(TwiceLinear()), gaussian_batches((4, 8), 3)
    report = qinsight.diagnose(model, data)
    assert [s.fqn for s in report.sites if s.kind.is_layer] == ["shared", "shared#1", "out"]
    # each call's input observed apart, on every batch: the second call's is relu(shared(x))
    first, second = report.observation("shared", Side.PRE), report.observation("shared#1", Side.PRE)
    assert first is not None and second is not None
    assert first.stats.batches == second.stats.batches == len(data)
    with torch.no_grad():
        inner = [torch.relu(model.shared(x)) for x in data]
    assert second.stats.min == pytest.approx(min(float(t.min()) for t in inner), abs=1e-6)
    assert second.stats.max == pytest.approx(max(float(t.max()) for t in inner), abs=1e-6)
    assert first.stats.min == pytest.approx(min(float(x.min()) for x in data), abs=1e-6)
    # one weight, observed once: both calls read the same statistics
    weights = [o for o in report.observations if o.side is Side.WEIGHT and o.fqn.startswith("shared")]
    assert [o.fqn for o in weights] == ["shared"]


def test_untraceable_model_is_a_frontend_error() -> None:
    from _models import DataDependent

    with pytest.raises(FrontendError, match=r"DataDependent cannot be FX-traced"):
        qinsight.diagnose(DataDependent(), [torch.randn(2, 4)], frontend="fx")
    # "auto" falls back to the eager frontend (tests/frontends/test_eager.py)
    assert qinsight.diagnose(DataDependent(), [torch.randn(2, 4)]).metadata.frontend == "eager"


def test_batches_may_be_tuples_or_mappings() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.fc(x * scale)
            return out

    model = TwoInputs().eval()
    batches: Sequence[object] = [
        (torch.randn(2, 4), torch.tensor(2.0)),
        {"x": torch.randn(2, 4), "scale": torch.tensor(1.0)},
    ]
    assert qinsight.diagnose(model, batches).metadata.batches == 2
    with pytest.raises(CalibrationError, match="not str"):
        qinsight.diagnose(model, ["nope"])


def test_instrument_with_own_loop(mlp: nn.Module) -> None:
    data = gaussian_batches((8, 16), 4)
    with qinsight.instrument(mlp, example_inputs=data[0]) as session:
        assert hooks_left(mlp) == 7  # 3 sites x (pre, post) observers + the batch counter
        for batch in data:
            mlp(batch)
        inside = session.report()
    assert hooks_left(mlp) == 0
    diagnosed = qinsight.diagnose(mlp, data, verify=False)  # instrument() verifies nothing: verify_report does
    assert session.report() == inside == diagnosed
    # without an example batch nothing runs before calibration: the sites do not know their input
    # ranks (nor would ops around the layers be found); the findings on these layers are the same
    with qinsight.instrument(mlp) as plain:
        for batch in data:
            mlp(batch)
    assert plain.report().results == diagnosed.results
    assert [s.input_rank for s in plain.report().sites] == [None] * 3 and [s.input_rank for s in diagnosed.sites] == [
        2
    ] * 3


def test_one_observer_per_slot_shared_by_detectors(mlp: nn.Module) -> None:
    with qinsight.instrument(mlp, detectors=[PerChannelDetector(), DynamicStaticDetector()]) as session:
        keys = [o.key for o in session._instrumenter.observers]
    assert keys == ["fc1:pre", "fc1:post", "fc2:pre", "fc2:post", "fc3:pre", "fc3:post"]


def test_detector_order_does_not_change_the_report(mlp: nn.Module) -> None:
    data = gaussian_batches((8, 16), 4)
    first = qinsight.diagnose(mlp, data, detectors=[PerChannelDetector(), DynamicStaticDetector()])
    second = qinsight.diagnose(mlp, data, detectors=[DynamicStaticDetector(), PerChannelDetector()])
    assert first.suggestions == second.suggestions
    assert set(first.results) == set(second.results)
    assert {o.key: o.stats for o in first.observations} == {o.key: o.stats for o in second.observations}


class Exploding:
    id = "test.exploding"
    api_version = 1

    def __init__(self, stage: FailureStage) -> None:
        self.stage = stage

    def insert_points(self, view: qinsight.frontends.ModelView) -> tuple[InsertPoint, ...]:
        if self.stage is FailureStage.INSERT_POINTS:
            raise RuntimeError("no points for you")
        return ()

    def analyze(self, view: qinsight.frontends.ModelView, stats: ObservedStats) -> DetectorResult:
        raise ZeroDivisionError("analysis went wrong")


@pytest.mark.parametrize("stage", [FailureStage.INSERT_POINTS, FailureStage.ANALYZE])
def test_failing_detector_is_recorded_and_others_stand(mlp: nn.Module, stage: FailureStage) -> None:
    report = qinsight.diagnose(mlp, gaussian_batches((8, 16), 3), detectors=[Exploding(stage), DynamicStaticDetector()])
    (failure,) = report.failures
    assert (failure.detector, failure.stage) == ("test.exploding", stage)
    assert failure.error in ("RuntimeError: no points for you", "ZeroDivisionError: analysis went wrong")
    assert len(report.result("qinsight.dynamic_static").findings) == 3
    assert "detector test.exploding failed" in qinsight.to_text(report)


class PointsAtNothing(Exploding):
    id = "test.points_at_nothing"

    def insert_points(self, view: qinsight.frontends.ModelView) -> tuple[InsertPoint, ...]:
        return (InsertPoint(fqn="no.such", side=Side.PRE, spec=ObserverSpec(channel_axis=-1)),)


def test_insert_point_on_unknown_module_fails_only_that_detector(mlp: nn.Module) -> None:
    report = qinsight.diagnose(
        mlp, [torch.randn(2, 16)], detectors=[PointsAtNothing(FailureStage.INSERT_POINTS), PerChannelDetector()]
    )
    (failure,) = report.failures
    assert failure.stage is FailureStage.INSERT_POINTS and "no op site 'no.such'" in failure.error
    assert len(report.result("qinsight.per_channel").findings) == 3


def test_strict_raises(mlp: nn.Module) -> None:
    with pytest.raises(ZeroDivisionError):
        qinsight.diagnose(mlp, [torch.randn(2, 16)], detectors=[Exploding(FailureStage.ANALYZE)], strict=True)
    assert hooks_left(mlp) == 0


def test_detector_list_errors(mlp: nn.Module) -> None:
    with pytest.raises(ValueError, match="detectors is empty"):
        qinsight.diagnose(mlp, [torch.randn(2, 16)], detectors=[])
    with pytest.raises(ValueError, match="given more than once: qinsight.dynamic_static"):
        qinsight.diagnose(
            mlp, [torch.randn(2, 16)], detectors=[DynamicStaticDetector(), DynamicStaticDetector(tolerance=0.3)]
        )


def test_report_records_what_ran(mlp: nn.Module) -> None:
    report = qinsight.diagnose(copy.deepcopy(mlp), gaussian_batches((8, 16), 3), model_name="mlp")
    meta = report.metadata
    assert (meta.model, meta.frontend, meta.backend, meta.batches) == ("mlp", "fx", "x86", 3)
    assert meta.torch_version == torch.__version__ and meta.qinsight_version == qinsight.__version__
    assert report.result("qinsight.dynamic_static").parameter("tolerance") == 0.5
    assert [s.fqn for s in report.sites] == ["fc1", "fc2", "fc3"]
