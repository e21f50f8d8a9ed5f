"""The options a user names (qinsight.types.Deployment, Goal): the shorthands users type, each record
checked once when it is built, and the former keywords still working, warned of, for one release."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import qinsight
from qinsight.core.options import options
from qinsight.types import Budget, Deployment, Goal, Target

Invalid = qinsight.errors.InvalidParameterError


def test_the_shorthands_a_user_types_become_records() -> None:
    assert Deployment.of("xnnpack", "plan") == Deployment(backend="xnnpack")
    assert Deployment.of("pt2e", "plan") == Deployment(flow="pt2e")
    assert Deployment.of(None, "plan") == Deployment()
    assert Goal.of("sqnr>=30", "plan") == Goal(target=Target(metric="sqnr", threshold=30.0))
    assert Goal.of("float<=3", "plan") == Goal(budget=Budget(unit="float", limit=3.0))
    assert Goal.of("bits <= 6", "plan_formats") == Goal(budget=Budget(unit="bits", limit=6.0))
    assert Goal.of("kl<=0.02", "plan_formats").target == Target(metric="kl", threshold=0.02, higher_is_better=False)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Deployment(backend="arm"), "Deployment: backend='arm' is invalid; expected one of "),
        (lambda: Deployment(flow="eager"), "Deployment: flow='eager' is invalid; expected 'fx' or 'pt2e' or 'torchao'"),
        (lambda: Deployment(quantizer="xnnpack"), "Deployment: quantizer='str' is invalid; expected a torchao PT2E"),
        (lambda: Deployment(lowered="yes"), "Deployment: lowered='yes' is invalid; expected True or False"),
        (lambda: Deployment(flow="fx", backend="xnnpack"), "for flow='fx' (xnnpack is served by flow='pt2e')"),
        (lambda: Deployment(flow="fx", lowered=True), "lowered=True is invalid; expected flow='pt2e' (the fx flow's"),
        (lambda: Deployment.of(3, "plan"), "plan: deploy='int' is invalid; expected a Deployment, a backend's"),
        (lambda: Goal(confidence=0.3, target=Target.parse("top1>=0.9")), "Goal: confidence=0.3 is invalid"),
        (lambda: Goal(confidence=0.95), "Goal: confidence=0.95 is invalid; expected None without a target"),
        (lambda: Goal.of("sqnr>=", "plan"), "plan: target='sqnr>='"),
        (lambda: Goal.of(["sqnr>=30"], "plan"), "plan: goal='list' is invalid"),
        (lambda: Goal(budget=2), "Goal: budget=2 is invalid; expected 'float<=N' or 'bits<=N'"),
        (lambda: Deployment.of("eager", "plan"), "plan: deploy='eager' is invalid; expected a backend's name ("),
    ],
)
def test_a_record_is_checked_once_when_it_is_built(build: object, message: str) -> None:
    with pytest.raises(Invalid, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()  # type: ignore[operator]


def test_the_former_keywords_are_sorted_into_their_records_and_warned_of() -> None:
    with pytest.warns(DeprecationWarning, match=r"plan\(backend=\.\.\.\) is now plan\(deploy=\.\.\.\)"):
        goal, deploy, _ = options("plan", None, None, {"backend": "xnnpack", "lowered": True, "target": "sqnr>=25"})
    assert deploy == Deployment(backend="xnnpack", lowered=True) and goal.target == Target.parse("sqnr>=25")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert options("plan", "float<=2", "x86", {})[:2] == (Goal.of("float<=2", "plan"), Deployment(backend="x86"))
    with pytest.raises(Invalid, match="^plan: deploy='str' is invalid; expected None beside backend="):
        options("plan", None, "x86", {"backend": "x86"})
    with pytest.raises(Invalid, match=r"^plan_formats: backend='x86' is invalid; expected no such argument"):
        options("plan_formats", None, None, {"backend": "x86"}, budget_unit="bits", takes=("goal",))
    with pytest.warns(DeprecationWarning), pytest.raises(Invalid, match="^plan: backend='arm' is invalid"):
        options("plan", None, None, {"backend": "arm"})  # the former keyword's mistake is the caller's function's
    with pytest.raises(Invalid, match="budget='bits<=6' is invalid; expected 'float<=N'"):
        options("plan", "bits<=6", None, {})  # a format plan's budget given to qinsight.plan


def test_diagnose_plan_and_plan_formats_take_at_most_ten_arguments() -> None:
    import inspect

    for function in (qinsight.diagnose, qinsight.plan, qinsight.plan_formats):
        named = [p for p in inspect.signature(function).parameters.values() if p.kind is not p.VAR_KEYWORD]
        assert len(named) <= 10, (function.__name__, [p.name for p in named])


def test_speed_and_resources_are_records_of_their_own() -> None:
    from qinsight.types import Resources, SpeedBound

    assert Goal(target="top1>=0.9", speed="speedup>=1.5").speed == SpeedBound(measure="speedup", limit=1.5)
    assert str(Goal(speed="latency <= 12.5ms").speed) == "latency<=12.5ms"
    for wrong in ("speedup<=1.5", "latency>=3", "speedup>=0", "fast>=2"):
        with pytest.raises(Invalid, match=rf"Goal: speed='{re.escape(wrong)}' is invalid; expected a speed bound"):
            Goal(speed=wrong)
    assert Resources(memory_budget="4GB").memory_budget == 4 * 10**9 and Resources().shard is None
    with pytest.raises(Invalid, match="Resources: memory_budget=4096 is invalid; expected a number of bytes"):
        Resources(memory_budget=4096)
    with pytest.raises(Invalid, match="plan: resources='str' is invalid; expected a qinsight.types.Resources"):
        qinsight.plan(torch.nn.Linear(2, 2), [torch.ones(1, 2)], [torch.ones(1, 2)], resources="4GB")  # type: ignore[arg-type]
    with pytest.warns(DeprecationWarning, match=r"plan\(memory_budget=...\) is now plan\(resources=...\)"):
        with pytest.raises(Invalid, match="plan: memory_budget='2 XB' is invalid"):
            qinsight.plan(torch.nn.Linear(2, 2), [torch.ones(1, 2)], [torch.ones(1, 2)], memory_budget="2 XB")
