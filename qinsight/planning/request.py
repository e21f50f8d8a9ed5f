"""A plan's arguments, each checked before the first forward: the flow, its backend, the target and
its range, the metric, the data. A mistake is one :class:`InvalidParameterError` naming the argument,
not a whole diagnosis and a float pass later."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from qinsight.apply.torch_flows import TORCH_FLOWS, flow_of
from qinsight.core.backend import Lowering, backend_lowering, is_quantizer, planned_backend
from qinsight.core.errors import InvalidParameterError
from qinsight.core.flows import check_flow_backend, flow_spec, flows_serving
from qinsight.core.metrics import MetricSpec, spec_of
from qinsight.core.options import Deployment, Goal, Resources
from qinsight.core.plan import Budget, SpeedBound, Target
from qinsight.core.sites import FlowName, checked_flow
from qinsight.planning.plan_ranks import Ranks
from qinsight.planning.scores import (
    SCORES,
    MetricFunction,
    agreeing_needed,
    metric_direction,
    rows_needed,
    scored_metric,
)
from qinsight.planning.simulate import MEMORY_BUDGET

DEFAULT_TARGET = "sqnr>=30"  # what a plan reaches where it is given neither a target nor a budget


@attrs.frozen(kw_only=True)
class PlanRequest:
    """What :func:`qinsight.plan` was asked, checked: ``goal`` is the target to reach or the budget to
    spend; ``metric`` scores the outputs (a built-in's or a plugin's name, or a function),
    ``metric_name`` is what the plan calls it."""

    goal: Target | Budget
    flow: FlowName
    backend: str
    metric: str | MetricFunction
    metric_name: str
    calibration: tuple[Any, ...]
    evaluation: tuple[Any, ...]
    smoothing: bool
    bias_correction: bool = False  # the biases corrected first where that scores better (plan(bias_correction=))
    held_out: tuple[Any, ...] = ()  # scored once, the plan's config converted: data the search never chose on
    lowering: Lowering | None = None  # configs scored as the program it lowers them to (lowered=True)
    quantizer: Any = None  # the user's quantizer every config starts from (quantizer=): float sites stripped from it
    confidence: float | None = None  # a top1 target held at this one-sided bound over the evaluation rows
    memory_budget: int = MEMORY_BUDGET  # bytes of configs' outputs the simulation's sweeps hold at once
    speed: SpeedBound | None = None  # what the lowered program must run at beside the goal
    ranks: Ranks = attrs.field(factory=Ranks)  # the ranks the evaluation batches are shared over (one process: none)

    def held_goal(self, rows: int) -> Target | Budget:
        """The goal the search and its verification hold on ``rows`` evaluation rows: the target, or with
        ``confidence`` the agreement whose Wilson bound meets it (half a row under: a score is a mean of
        rows); too few rows for that is one :class:`InvalidParameterError`."""
        if self.confidence is None or isinstance(self.goal, Budget):
            return self.goal
        needed = agreeing_needed(self.goal.threshold, rows, self.confidence)
        if needed is None:
            least = rows_needed(self.goal.threshold, self.confidence)
            more = f"at least {least} rows" if least is not None else "a threshold under 1"
            raise InvalidParameterError(
                "plan",
                "confidence",
                self.confidence,
                f"evaluation data that can bound {self.goal} (all {rows} rows agreeing do not): {more}, or "
                "confidence=None",
            )
        return attrs.evolve(self.goal, threshold=(needed - 0.5) / rows)

    @property
    def spec(self) -> MetricSpec:
        """The plan's metric as one spec, the direction every comparison of its scores takes: the one
        table's, a plugin metric's own, a function of one's own higher is better; the target's direction
        where it names one (``accuracy>=0.98`` for a function)."""
        spec = spec_of(self.metric_name) or MetricSpec(
            name=self.metric_name, higher_is_better=metric_direction(self.metric_name)
        )
        if isinstance(self.goal, Target) and self.goal.higher_is_better != spec.higher_is_better:
            return attrs.evolve(spec, higher_is_better=self.goal.higher_is_better)
        return spec

    @property
    def everything(self) -> list[Any]:
        """Every batch the plan sees (a flow learns the inputs' shapes from them)."""
        return [*self.calibration, *self.evaluation, *self.held_out]


def plan_request(
    *,
    goal: Goal,
    deploy: Deployment,
    calibration_data: Iterable[Any],
    evaluation_data: Iterable[Any],
    smoothing: bool = False,
    bias_correction: bool = False,
    held_out_data: Iterable[Any] | None = None,
    resources: Resources = Resources(),
) -> PlanRequest:
    """The arguments of :func:`qinsight.plan`, checked; the batches read once into tuples. No flow: the
    first serving the backend (FX for x86, PT2E for XNNPACK), one that lowers where ``lowered``. No
    backend: the one the quantizer quantizes for, else x86."""
    flow, quantizer, lowered, confidence = deploy.flow, deploy.quantizer, deploy.lowered, goal.confidence
    if deploy.qconfig_mapping is not None:
        expected = "no qconfig_mapping: a plan starts from the report's config (a PT2E plan from your quantizer)"
        raise InvalidParameterError("plan", "deploy", "Deployment(qconfig_mapping=...)", expected)
    backend = planned_backend("plan", deploy.backend, quantizer)
    if quantizer is not None and flow is None:
        flow = flow_of(quantizer, "plan", "quantizer").name
    name = checked_flow(flow if flow is not None else _serving(backend, lowered), "plan")
    if flow_spec(name).plans_formats:
        raise InvalidParameterError(
            "plan",
            "flow",
            name,
            "'fx' or 'pt2e' (qinsight.plan_formats plans torchao's quantize_, a format per Linear)",
        )
    # the quantizer first: the backend it implies is not what the user got wrong
    if quantizer is not None and not (TORCH_FLOWS[name].takes(quantizer) and is_quantizer(quantizer)):
        expected = "a torchao Quantizer, for flow='pt2e' (a plan starts from a PT2E quantizer)"
        raise InvalidParameterError("plan", "quantizer", type(quantizer).__name__, expected)
    check_flow_backend("plan", name, backend)
    if lowered and not flow_spec(name).lowers:
        raise InvalidParameterError("plan", "lowered", True, f"flow='pt2e' (the {name} flow's model is not lowered)")
    lowering = backend_lowering("plan", backend) if lowered else None
    if goal.speed is not None and lowering is None:
        expected = "None, or Deployment(lowered=True): only a lowered program is timed"
        raise InvalidParameterError("plan", "speed", str(goal.speed), expected)
    if goal.target is not None and goal.budget is not None:
        both = f"{goal.target} and {goal.budget}"
        raise InvalidParameterError("plan", "goal", both, "a target or a budget, not both (plan_formats takes both)")
    aim = goal.budget or goal.target or Target.parse(DEFAULT_TARGET)
    chosen, metric_name = _metric(aim, goal.metric)
    if confidence is not None and not (metric_name == "top1" and isinstance(aim, Target)):
        expected = "a one-sided confidence in [0.5, 1) (0.95) for a top1 target, or None"
        raise InvalidParameterError("plan", "confidence", confidence, expected)
    calibration, evaluation, held_out, ranks = _data(calibration_data, evaluation_data, held_out_data, resources)
    return PlanRequest(
        goal=aim,
        flow=name,
        backend=backend,
        metric=chosen,
        metric_name=metric_name,
        calibration=calibration,
        evaluation=evaluation,
        smoothing=smoothing,
        bias_correction=bias_correction,
        held_out=held_out,
        lowering=lowering,
        quantizer=quantizer,
        confidence=float(confidence) if confidence is not None else None,
        memory_budget=MEMORY_BUDGET if resources.memory_budget is None else resources.memory_budget,
        speed=goal.speed,
        ranks=ranks,
    )


def _data(
    calibration_data: Iterable[Any],
    evaluation_data: Iterable[Any],
    held_out_data: Iterable[Any] | None,
    resources: Resources,
) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], Ranks]:
    """The batches, read once into tuples and checked, and the ranks the evaluation batches are shared over."""
    batches = {}
    for argument, data in (("calibration_data", calibration_data), ("evaluation_data", evaluation_data)):
        batches[argument] = tuple(data)
        if not batches[argument]:
            raise InvalidParameterError("plan", argument, "no batches", "at least one batch")
    held_out = tuple(held_out_data) if held_out_data is not None else ()
    if held_out_data is not None and not held_out:
        raise InvalidParameterError("plan", "held_out_data", "no batches", "at least one batch, or None")
    ranks = Ranks.of(resources.shard == "distributed")
    ranks.share(batches["evaluation_data"], "evaluation_data")  # a rank without a batch: said before any forward
    if held_out:
        ranks.share(held_out, "held_out_data")
    return batches["calibration_data"], batches["evaluation_data"], held_out, ranks


def _serving(backend: str, lowered: bool) -> str:
    """The first flow serving ``backend`` (that lowers, if ``lowered``); none: FX, whose check names the error."""
    return (*flows_serving(backend, lowered=lowered), "fx")[0]


def _metric(goal: Target | Budget, metric: str | MetricFunction | None) -> tuple[str | MetricFunction, str]:
    """The metric that scores the outputs and its name: the target's (a built-in's or a plugin's), unless
    a budget (SQNR by default) or a function of one's own (named as the target names it)."""
    if metric is None:
        if isinstance(goal, Budget):
            return "sqnr", "sqnr"
        scored_metric("plan", goal.metric, goal, given=False)
        return goal.metric, goal.metric
    if isinstance(metric, str):
        scored_metric("plan", metric, goal, given=True)
        if isinstance(goal, Target) and metric != goal.metric:
            raise InvalidParameterError("plan", "metric", metric, f"the target's own metric, {goal.metric!r}")
        return metric, metric
    if not callable(metric):
        raise InvalidParameterError(
            "plan", "metric", type(metric).__name__, f"one of {', '.join(SCORES)}, a plugin metric or a function"
        )
    return metric, goal.metric if isinstance(goal, Target) else getattr(metric, "__name__", "metric")


__all__ = ["PlanRequest", "plan_request"]
