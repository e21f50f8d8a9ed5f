"""Bad calibration data and misbehaving plugins: a CalibrationError (or a recorded failure) naming what
went wrong, the model given back unchanged, and a report that still renders and saves."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
import torch
from _checks import examples, hooks_left, json_paths
from _data import gaussian_batches
from _models import MLP, seeded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import qinsight
from qinsight.outputs.diff import diff_reports
from qinsight.outputs.serde import report_from_json, report_to_dict
from qinsight.plugin import DetectorResult, Finding, ModelView, ObservedStats, result_of


def batch(kind: str, seed: int) -> object:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 16, generator=g)
    return {
        "good": x,
        "unbatched": x[0],
        "none": None,
        "nan": x.masked_fill(x > 1, math.nan),
        "inf": x.masked_fill(x > 1, math.inf),
        "narrow": x[:, :5],
        "double": x.double(),
        "int": (x * 10).long(),
        "empty": x[:0],
        "tuple": (x,),
        "string": "not a tensor",
        "mapping": {"input": x},
    }[kind]


KINDS = st.sampled_from(
    ["good", "unbatched", "none", "nan", "inf", "narrow", "double", "int", "empty", "tuple", "string", "mapping"]
)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(KINDS, min_size=0, max_size=5), raise_after=st.none() | st.integers(0, 4))
def test_any_calibration_data_gives_a_report_or_a_calibration_error(kinds: list[str], raise_after: int | None) -> None:
    model = seeded(MLP())
    state = copy.deepcopy(model.state_dict())

    def data() -> Iterator[object]:
        for index, kind in enumerate(kinds):
            if index == raise_after:
                raise RuntimeError("the loader failed")
            yield batch(kind, index)

    try:
        report = qinsight.diagnose(model, data())
    except qinsight.errors.CalibrationError as exc:
        assert exc.batch is None or 0 <= exc.batch <= len(kinds)
        assert "\n" not in str(exc)
    except (
        qinsight.errors.FrontendError
    ) as exc:  # nothing to find the sites with (no batches and not traceable): not the case here
        raise AssertionError(exc) from exc
    else:
        assert report.metadata.batches >= 1
        report_from_json(json.dumps(report_to_dict(report)))
        qinsight.to_text(report)
    assert hooks_left(model) == 0
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_an_unbatched_input_is_observed_per_feature() -> None:
    model = nn.Sequential(nn.Linear(16, 8))
    report = qinsight.diagnose(model, [torch.randn(16, generator=torch.Generator().manual_seed(i)) for i in range(4)])
    stats = report.observation("0", qinsight.types.Side.PRE)
    assert stats is not None and stats.stats.channel_min is not None and len(stats.stats.channel_min) == 16


@pytest.mark.parametrize(
    "data,batch,message",
    [
        ([None, torch.randn(2, 16)], 0, "calibration batch 0 is None"),
        ([torch.randn(2, 16), torch.randn(2, 5)], 1, "calibration batch 1 failed: RuntimeError: mat1 and mat2 shapes"),
    ],
)
def test_bad_batches_name_their_index_and_the_models_message(data: list[object], batch: int, message: str) -> None:
    with pytest.raises(qinsight.errors.CalibrationError, match=message) as info:
        qinsight.diagnose(seeded(MLP()), data)
    assert info.value.batch == batch


@pytest.mark.parametrize(
    "data,error,message",
    [
        (
            None,
            qinsight.errors.InvalidParameterError,
            "diagnose: calibration_data='NoneType' is invalid; expected an iterable of batches",
        ),
        ("batches.pt", qinsight.errors.InvalidParameterError, "calibration_data='str' is invalid"),
        (
            [torch.randn(0, 16)] * 2,
            qinsight.errors.CalibrationError,
            r"calibration batch 0 is empty \(shape \(0, 16\)\): drop batches with zero rows",
        ),
        ([torch.randn(2, 16), torch.randn(0, 16)], qinsight.errors.CalibrationError, "calibration batch 1 is empty"),
    ],
)
def test_data_that_is_no_batches_is_one_error_naming_what_to_change(
    data: object, error: type[Exception], message: str
) -> None:
    # with the defaults (verification on): the raw TypeError of iter(None) and torch's reshape of zero
    # rows were what a user saw
    with pytest.raises(error, match=message) as info:
        qinsight.diagnose(seeded(MLP()), data)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


@attrs.frozen(kw_only=True)
class BrokenFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = ("broken",)

    @property
    def verdict(self) -> str:
        return "broken"

    @property
    def actionable(self) -> bool:
        return True

    def reason(self) -> str:
        raise ZeroDivisionError("no reason")


@attrs.frozen
class DictDetector:
    id: ClassVar[str] = "acme.dict"
    api_version: ClassVar[int] = 1
    finding_type: ClassVar[type[Finding]] = BrokenFinding

    def insert_points(self, view: ModelView) -> tuple[()]:
        return ()

    def analyze(self, view: ModelView, stats: ObservedStats) -> Any:
        return {"findings": []}


@attrs.frozen
class BrokenReasonDetector(DictDetector):
    id: ClassVar[str] = "acme.broken"

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        return result_of(self, [BrokenFinding(fqn=view.sites[0].fqn)], ())


def test_plugin_results_are_checked_where_they_enter_the_report(tmp_path: Path) -> None:
    detectors = [DictDetector(), BrokenReasonDetector(), qinsight.detectors.OutlierDetector()]
    report = qinsight.diagnose(seeded(MLP()), gaussian_batches((4, 16), 2), detectors=detectors)  # type: ignore[list-item]
    failures = {f.detector: (f.stage, f.error) for f in report.failures}
    assert failures["acme.dict"] == (
        qinsight.types.FailureStage.ANALYZE,
        "TypeError: analyze() returned dict, not a DetectorResult",
    )
    assert "cannot say its verdict or reason: ZeroDivisionError: no reason" in failures["acme.broken"][1]
    assert [r.detector for r in report.results] == ["qinsight.outliers"]
    qinsight.save_report(report, tmp_path / "r.json")  # nothing left that cannot be written or shown
    assert "detector acme.broken failed at analyze" in qinsight.to_text(report)


@pytest.fixture(scope="module")
def base_report() -> qinsight.Report:
    model = seeded(MLP())
    data = gaussian_batches((8, 16), 2)
    return qinsight.diagnose(model, data, model_name="mlp")


def _set(data: Any, path: tuple[Any, ...], new: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = new


def test_a_finding_read_raw_against_a_typed_one_differs(base_report: qinsight.Report) -> None:
    # found by the test below: a finding whose type no detector knows is kept raw, its objects where the
    # typed finding has lists; comparing an object with a list recursed without end
    mutated = report_to_dict(base_report)
    mutated["results"][2]["findings"][0]["type"] = 0.0
    other = report_from_json(json.dumps(mutated))
    assert not diff_reports(base_report, other, rel_tol=0, abs_tol=0).empty


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_two_different_reports_differ_and_equal_ones_do_not(
    base_report: qinsight.Report, data: st.DataObject
) -> None:
    assert diff_reports(base_report, base_report, rel_tol=0, abs_tol=0).empty
    mutated = report_to_dict(base_report)
    path = data.draw(
        st.sampled_from([p for p in json_paths(mutated, leaves=True) if p[0] not in ("format", "schema_version")])
    )
    old = mutated
    for part in path:
        old = old[part]
    new = data.draw(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False), st.integers(0, 10**6), st.booleans(), st.text(max_size=8)
        ).filter(lambda v: v != old or type(v) is not type(old))
    )
    _set(mutated, path, new)
    try:
        other = report_from_json(json.dumps(mutated))
    except qinsight.errors.ReportFileError:
        return  # not a valid report: nothing to diff
    if json.dumps(report_to_dict(other)) == json.dumps(report_to_dict(base_report)):
        return  # the same report after all (e.g. 1 read as 1.0)
    assert not diff_reports(base_report, other, rel_tol=0, abs_tol=0).empty, path


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: qinsight.diagnose("a model", [torch.randn(2, 4)]), "diagnose: model="),  # type: ignore[arg-type]
        (lambda: qinsight.instrument("a model").__enter__(), "instrument: model="),  # type: ignore[arg-type]
        (lambda: qinsight.instrument(MLP(), backend="tpu").__enter__(), "instrument: backend="),
        (lambda: qinsight.diagnose(MLP(), [], quantizer=object()), "diagnose: quantizer="),
    ],
    ids=["diagnose", "instrument", "instrument backend", "diagnose, no quantizer, no data"],
)
def test_a_mistake_names_the_function_the_user_called(call: Any, named: str) -> None:
    with pytest.raises(qinsight.errors.InvalidParameterError, match=f"^{named}"):
        call()
