"""A third party's metric (a ``qinsight.metrics`` entry point) as a plan's target: scored on the output
rows, bounded the way the plugin says is better, and the plan's verified score is the plugin's own
number for the config quantized as a user would."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import pytest
from _peers import outputs

import qinsight
from qinsight.examples import example
from qinsight.plugin.testing import write_distribution

CLOSENESS = """
from qinsight.plugin import Metric

def _close(x, y):
    return float(((x - y).abs() <= 0.1 * x.abs().amax()).double().mean())

def _worst(x, y):
    return float((x - y).abs().amax() / x.abs().amax())

close = Metric(name="close", higher_is_better=True, on_tensors=_close)
worst = Metric(name="worst", higher_is_better=False, on_tensors=_worst)
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    root = write_distribution(tmp_path, "acme-closeness", {"acme_closeness": CLOSENESS}, {})
    entries = "close = acme_closeness:close\nworst = acme_closeness:worst\n"
    (next(root.glob("*.dist-info")) / "entry_points.txt").write_text(f"[qinsight.metrics]\n{entries}")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "acme_closeness", raising=False)
    import acme_closeness  # type: ignore[import-not-found]

    return acme_closeness


def test_a_plugin_metric_is_a_plan_target_scored_as_the_plugin_computes_it(plugin: object) -> None:
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(8)
    calibration, evaluation = data[:4], data[4:]
    plan = qinsight.plan(model, calibration, evaluation, target="close>=0.9")
    assert (plan.metric, str(plan.target), plan.higher_is_better) == ("close", "close>=0.9", True)
    quantized = qinsight.quantize(model, plan, calibration)
    rows = [outputs(m, evaluation) for m in (model, quantized)]
    assert plan.verified_score == pytest.approx(plugin.close.on_tensors(*rows), abs=1e-9)  # type: ignore[attr-defined]
    assert plan.reached == (plan.verified_score >= 0.9)


def test_a_plugin_metric_is_bounded_its_own_way_and_directs_a_budget(plugin: object) -> None:
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(8)
    with pytest.raises(qinsight.errors.InvalidParameterError, match=r"target='close<=0.9'.*close>=N"):
        qinsight.plan(model, data[:4], data[4:], target="close<=0.9")
    plan = qinsight.plan(model, data[:4], data[4:], budget=1, metric="worst")
    assert plan.metric == "worst" and not plan.higher_is_better  # the plugin's word: lower is better
    assert plan.reached and plan.verified_score <= plan.default_score


def test_the_former_keywords_still_plan_for_one_release_and_say_their_record() -> None:
    """``target=``, ``budget=`` are ``goal``'s now; the target form of a budget is a goal's shorthand."""
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(6)
    with pytest.warns(
        DeprecationWarning, match=r"plan\(target=\.\.\.\) is now plan\(goal=\.\.\.\): qinsight.types.Goal"
    ):
        former = qinsight.plan(model, data[:3], data[3:], target="float<=1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the records say it without a warning
        plan = qinsight.plan(model, data[:3], data[3:], goal="float<=1")
    assert plan.target == former.target == qinsight.types.Budget(unit="float", limit=1.0) and plan.reached
    assert plan.suggestions == former.suggestions and plan.verified_score == former.verified_score
    with pytest.raises(
        qinsight.errors.InvalidParameterError, match="^plan: goal='Goal' is invalid; expected None beside budget="
    ):
        qinsight.plan(model, data[:3], data[3:], goal=qinsight.types.Goal(), budget=1)
    with pytest.raises(qinsight.errors.InvalidParameterError, match="^plan: targets=.* no such argument"):
        qinsight.plan(model, data[:3], data[3:], targets="sqnr>=30")


def test_a_plugin_metric_is_a_format_plans_target_too(plugin: object) -> None:
    """``plan_formats`` scores a plugin metric as ``plan`` does: on the output rows, in the plugin's
    direction (``worst``: lower is better), to a target between the uniform formats' scores."""
    pytest.importorskip("torchao.quantization")
    chosen = example("encoder")
    model, data = chosen.model(), chosen.data(6)
    every = qinsight.plan_formats(model, data, goal=qinsight.types.Goal(budget="bits<=32", metric="worst"))
    uniform = {point.label: point.score for point in every.uniform}
    int8, int4 = uniform["uniform int8"], uniform["uniform int4_g32"]
    assert 0.0 < int8 < int4  # the plugin's numbers: int4 moves the worst output further
    threshold = math.sqrt(int8 * int4)
    plan = qinsight.plan_formats(model, data, goal=f"worst<={threshold:.6f}", compare_orders=False)
    assert plan.metric == "worst" and plan.reached and plan.chosen.score <= threshold
    assert {layer.format for layer in plan.layers} == {"int8", "int4_g32"}  # some layers take the cheaper one
    with pytest.raises(qinsight.errors.InvalidParameterError, match=r"^plan_formats: target='worst>=0.5'.*worst<=N"):
        qinsight.plan_formats(model, data, goal="worst>=0.5")
    with pytest.raises(qinsight.errors.InvalidParameterError, match=r"^plan_formats: metric='nope'.*plugin metric"):
        qinsight.plan_formats(model, data, goal=qinsight.types.Goal(budget="bits<=6", metric="nope"))
