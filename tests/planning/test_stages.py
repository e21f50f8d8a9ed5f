"""The plan's stages alone: each is a step over a :class:`PlanRun` returning plain values, so each is
tested here on a small model, with a flow whose real quantization fails where a test says it does.
A config the flow cannot build or run is a typed result (:class:`FailedConfig`) at every stage."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import qinsight
from qinsight.apply.trial import Trial
from qinsight.core.metrics import spec_of
from qinsight.core.outcomes import FailedConfig
from qinsight.core.plan import PlanStep
from qinsight.core.smoothing import SmoothingMapping
from qinsight.core.suggestions import QuantSuggestion
from qinsight.examples import example
from qinsight.planning import stages
from qinsight.planning.plan_run import PlanRun
from qinsight.planning.request import plan_request
from qinsight.planning.simulated_flows import FxFlow
from qinsight.planning.stages import Checked, Searched
from qinsight.planning.switches import Mode
from qinsight.planning.verify import bisected, verified
from qinsight.types import Deployment, Goal, NoteKind, SuggestionCheck, SuggestionKind, Target

TOP1 = spec_of("top1")
assert TOP1 is not None
NO_KERNEL = "RuntimeError: no kernel for an equalized linear on this backend"


class EqualizingFails(FxFlow):
    """FX as it is, except that a config equalizing any layer fails as a flow fails (its error carried)."""

    def trial(
        self, suggestions: tuple[QuantSuggestion, ...], calibration: Sequence[object], scored: Sequence[object]
    ) -> Trial:
        if any(s.equalize for s in suggestions):
            return Trial(failure=RuntimeError("no kernel for an equalized linear on this backend"))
        return super().trial(suggestions, calibration, scored)


@pytest.fixture(scope="module")
def cnn_run() -> tuple[PlanRun, qinsight.Report, EqualizingFails]:
    """The built-in CNN's plan run (4 calibration, 4 evaluation batches, FX), its report (``fc``: an
    equalization suggested) and the flow that fails to equalize."""
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(8)
    report = qinsight.diagnose(model, data[:4], deploy="fx", verify=False)
    assert any(s.equalize for s in report.suggestions)
    request = plan_request(
        goal=Goal(target="sqnr>=20"), deploy=Deployment(flow="fx"), calibration_data=data[:4], evaluation_data=data[4:]
    )
    return PlanRun(request, model, lambda *_: None), report, EqualizingFails(model, report.sites, "x86", data)


def test_a_suggestion_the_flow_cannot_run_is_checked_as_failed_with_the_flows_error(
    cnn_run: tuple[PlanRun, qinsight.Report, EqualizingFails],
) -> None:
    run, report, flow = cnn_run
    default = run.real(flow, ())
    assert isinstance(default, float) and math.isfinite(default)
    base = stages.Baseline(flow, default, flow, (), default)
    found = stages.checked(run, stages.Subject(run.model, report, SmoothingMapping(), flow), base)
    (check,) = [c for c in found.checks if c.kinds == (SuggestionKind.EQUALIZE,)]
    assert not check.kept and check.why is NoteKind.FLOW_CANNOT_RUN
    assert NO_KERNEL in check.reason and math.isnan(check.together)  # not a score: the flow's error, said
    assert not any(s.equalize for s in found.kept)
    (note,) = run.failure_notes(flow.name)
    assert note.kind is NoteKind.FAILED_CONFIGS and NO_KERNEL in note.text
    assert note.text.startswith("2 candidate configs")  # with the others, and alone: each one left out
    # the later stages run on the search the run owns, from the modes the checks started it at
    measured = stages.sensitivity(run, found)
    assert {s.fqn for s in measured.sites} == set(run.search.candidates) == {s.fqn for s in report.sites}
    searched = stages.searched(run, found, measured)
    real = verified(run.real_score(flow), run.request.goal, run.spec, found, searched, default)
    assert not real.default and not any(s.equalize for s in real.suggestions)
    assert run.spec.worse(FailedConfig("x"), real.score) and not run.spec.worse(real.score, FailedConfig("x"))


def test_a_planned_config_the_flow_cannot_run_returns_the_default_saying_why() -> None:
    steps = (
        PlanStep(fqn="", score=0.5, kept=True, quantized_fraction=0.0, stage="start"),
        PlanStep(fqn="conv1", score=0.95, kept=True, quantized_fraction=1.0),
    )
    modes = {"conv1": Mode.STATIC}
    probes: list[tuple[QuantSuggestion, ...]] = []

    def real(advice: tuple[QuantSuggestion, ...]) -> float | FailedConfig:
        probes.append(advice)
        return FailedConfig("KeyError: conv1") if not advice or not advice[0].keep_float else 0.6

    goal = Target.parse("top1>=0.93")
    found = verified(real, goal, TOP1, Checked((), modes, ()), Searched(steps, modes, ()), default_score=0.7)
    # quantizing conv1 fails; bisection keeps it float (0.6, below the default's 0.7): the default returns
    assert found.default and found.score == 0.7 and found.suggestions == ()
    assert [n.kind for n in found.notes] == [NoteKind.BISECTED, NoteKind.DEFAULT_RETURNED]
    assert "a config it cannot build or run" in found.notes[0].text and len(probes) == 2


def test_verification_drops_kept_parts_the_search_cannot_see_where_they_lower_the_planned_config() -> None:
    """An equalization measured for real on the default config helped there; the search cannot see it
    and plans a config it lowers (MobileNetV2 in FX: 25/32 with the report's equalizations against the
    simulation's 30/32). The verification quantizes the planned config with and without such parts
    and keeps the better, the dropped part's check saying why."""
    kept = (QuantSuggestion(fqn="conv1", equalize=True), QuantSuggestion(fqn="add#0", keep_float=True))
    check = SuggestionCheck.of(kept[0], before=0.7, alone=0.75, kept=True, reason="measured for real")
    assert check.kinds == (SuggestionKind.EQUALIZE,)
    steps = (
        PlanStep(fqn="", score=0.5, kept=True, quantized_fraction=0.0, stage="start"),
        PlanStep(fqn="conv1", score=0.95, kept=True, quantized_fraction=1.0),
    )
    modes = {"conv1": Mode.STATIC, "add#0": Mode.FLOAT}
    goal = Target.parse("top1>=0.93")
    asked: list[tuple[QuantSuggestion, ...]] = []

    def real(advice: tuple[QuantSuggestion, ...]) -> float:
        asked.append(advice)
        return 0.8 if any(s.equalize for s in advice) else 0.95

    checked, searched = Checked((check,), modes, kept), Searched(steps, modes, ())
    found = verified(real, goal, TOP1, checked, searched, default_score=0.5)
    assert found.score == 0.95 and len(asked) == 2 and not found.default
    assert not any(s.equalize for s in found.suggestions) and any(
        s.fqn == "add#0" and s.keep_float for s in found.suggestions
    )
    assert not found.checks[0].kept and found.checks[0].why is NoteKind.UNSEEN_DROPPED
    assert [note.kind for note in found.notes] == [NoteKind.UNSEEN_DROPPED]
    # where the planned config reaches the target with them, they stay, after one real quantization
    asked.clear()
    same = verified(lambda advice: asked.append(advice) or 0.94, goal, TOP1, checked, searched, default_score=0.5)
    assert (same.checks, same.score, same.notes) == ((check,), 0.94, ()) and len(asked) == 1
    assert {s.fqn: s for s in same.suggestions}["conv1"].equalize


def test_a_plan_says_where_its_time_went_stage_by_stage_and_its_file_keeps_it(tmp_path: Path) -> None:
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(8)
    plan = qinsight.plan(model, data[:4], data[4:], goal="sqnr>=20", deploy="fx")
    cost = plan.cost
    assert cost is not None
    names = [stage.stage for stage in cost.stages]
    assert names == ["diagnosis", "baseline", "checks", "sensitivity", "search", "verification", "converted"]
    assert {s.stage: s.real_configs for s in cost.stages}["baseline"] >= 1  # the default config, for real
    # the plan's config read back from its verification's measurement, which ran the held-out data too
    assert {s.stage: s.real_configs for s in cost.stages}["converted"] == 0
    assert cost.real_configs >= 3 and 0.0 < cost.real_seconds <= cost.seconds
    assert math.ceil(cost.simulated_forwards) == plan.evaluations > 0
    report = qinsight.diagnose(model, data[:4], deploy="fx", verify=False).with_plan(plan)
    assert f"time: {cost.describe()}" in qinsight.to_text(report)
    path = tmp_path / "report.json"
    qinsight.save_report(report, path)
    loaded = qinsight.load_report(path).plan
    assert loaded is not None and loaded.cost == cost


@given(
    sites=st.integers(2, 24),
    data=st.data(),
)
def test_a_bisection_searching_on_a_probe_ends_where_the_real_one_does(sites: int, data: st.DataObject) -> None:
    """A lowered plan bisects on the reference models (the probe) and confirms on the program: wherever the
    probe's boundary lies, the plan keeps the longest prefix the real score meets, as a bisection on
    the real score alone does, with fewer real quantizations where the two boundaries agree."""
    real_boundary = data.draw(st.integers(0, sites - 1), label="the last prefix the program meets")
    probe_boundary = data.draw(st.integers(0, sites - 1), label="the last prefix the reference meets")
    names = [f"s{i}" for i in range(sites)]
    steps = tuple(PlanStep(fqn=n, score=1.0, kept=True, quantized_fraction=0.5, mode="static") for n in names)
    searched = Searched(steps, {n: Mode.STATIC for n in names}, ())
    goal = Target.parse("sqnr>=0.5")

    def scorer(boundary: int, calls: list[int]) -> Any:
        def score(advice: tuple[Any, ...]) -> float:
            floated = sum(1 for s in advice if s.keep_float)  # the prefix quantizes the others
            calls.append(1)
            return 1.0 if sites - floated <= boundary else 0.0

        return score

    start = {n: Mode.STATIC for n in names}
    alone: list[int] = []
    plain = bisected(scorer(real_boundary, alone), goal, (), start, searched, 0.0)
    probed: list[int] = []
    probes: list[int] = []
    found = bisected(scorer(real_boundary, probed), goal, (), start, searched, 0.0, scorer(probe_boundary, probes))
    quantized = sum(1 for mode in found[0].values() if mode is not Mode.FLOAT)
    assert found[0] == plain[0] and quantized == real_boundary and found[1] == 1.0
    if probe_boundary == real_boundary:  # the real score confirms where the probe ended, and one step past it
        assert len(probed) <= 2 and len(alone) >= min(2, math.ceil(math.log2(sites)))
