"""Options a user can name: where the quantized model goes (:class:`Deployment`) and what a planner aims
at (:class:`Goal`). Each takes the shorthands users type (``"xnnpack"``, ``"sqnr>=30"``, ``"float<=3"``)
and is checked once, when it is built: a mistake is one :class:`InvalidParameterError` naming the
field, before any model runs. ``diagnose``, ``plan`` and ``plan_formats`` take them; their former
keywords (``backend=``, ``flow=``, ``quantizer=``, ``lowered=``, ``qconfig_mapping=``, ``target=``,
``budget=``, ``metric=``, ``confidence=``) still work for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import attrs

from qinsight.core.backend import backend_names, check_backend, is_quantizer
from qinsight.core.errors import InvalidParameterError
from qinsight.core.flows import FLOW_SPECS, check_flow_backend, flow_spec
from qinsight.core.plan import Budget, BudgetUnit, SpeedBound, Target
from qinsight.core.sites import FLOWS, FlowName, checked_flow


def _backend(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidParameterError("Deployment", attribute.name, type(value).__name__, "a backend's name or None")
    check_backend("Deployment", value)


def _flow(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidParameterError("Deployment", attribute.name, type(value).__name__, "a flow's name or None")
    checked_flow(value, "Deployment")


def _flag(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidParameterError(type(instance).__name__, attribute.name, value, "True or False")


def _quantizer(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not is_quantizer(value):
        expected = "a torchao PT2E Quantizer (XNNPACKQuantizer, X86InductorQuantizer, a ComposableQuantizer) or None"
        raise InvalidParameterError("Deployment", attribute.name, type(value).__name__, expected)


@attrs.frozen(kw_only=True)
class Deployment:
    """Where the quantized model goes: the ``backend`` it runs on (``None``: your quantizer's, else x86),
    the ``flow`` that quantizes it (``None``: the first serving the backend), the config you will
    quantize with (``quantizer``: a PT2E ``Quantizer``; ``qconfig_mapping``: FX's), and whether the
    program lowered for the backend is what is scored (``lowered``, PT2E).

    ``Deployment.of`` takes the shorthands: a backend's name (``"xnnpack"``), a flow's (``"pt2e"``), a
    quantizer, or a Deployment.
    """

    backend: str | None = attrs.field(default=None, validator=_backend)
    flow: FlowName | None = attrs.field(default=None, validator=_flow)
    quantizer: object | None = attrs.field(default=None, validator=_quantizer)
    qconfig_mapping: object | None = None
    lowered: bool = attrs.field(default=False, validator=_flag)

    def __attrs_post_init__(self) -> None:
        if self.quantizer is not None and self.qconfig_mapping is not None:
            raise InvalidParameterError(
                "Deployment", "quantizer", type(self.quantizer).__name__, "None beside qconfig_mapping= (one config)"
            )
        if self.flow is not None and self.backend is not None:
            check_flow_backend("Deployment", self.flow, self.backend)
        if self.lowered and self.flow is not None and not flow_spec(self.flow).lowers:
            lowering = next(name for name, spec in FLOW_SPECS.items() if spec.lowers)
            expected = f"flow={lowering!r} (the {self.flow} flow's model is not lowered)"
            raise InvalidParameterError("Deployment", "lowered", True, expected)

    @classmethod
    def named(cls, owner: str, **fields: Any) -> Deployment:
        """A Deployment of ``fields`` that ``owner``'s arguments gave (its former keywords, a command
        line's options): a mistake is ``owner``'s, the function or command the user called."""
        try:
            return cls(**fields)
        except InvalidParameterError as exc:
            raise InvalidParameterError(owner, exc.name, exc.value, exc.expected) from None

    @classmethod
    def of(cls, value: object, owner: str) -> Deployment:
        """``value`` as a Deployment: a backend's or a flow's name, a PT2E quantizer, or one already built."""
        if value is None:
            return cls()
        if isinstance(value, Deployment):
            return value
        if isinstance(value, str):
            if value in FLOWS:
                return cls(flow=checked_flow(value, owner))
            if value not in backend_names():
                expected = f"a backend's name ({', '.join(backend_names())}) or a flow's ({', '.join(FLOWS)})"
                raise InvalidParameterError(owner, "deploy", value, expected)
            return cls(backend=value)
        if is_quantizer(value):
            return cls(quantizer=value)
        expected = "a Deployment, a backend's or a flow's name, or a PT2E quantizer"
        raise InvalidParameterError(owner, "deploy", type(value).__name__, expected)


MetricFunction = Callable[[Any, Any], float]


def _budget_unit(text: str) -> BudgetUnit | None:
    """The unit a budget's text spends (``"float<=3"``, ``"bits <= 6"``); ``None``: the text is no budget."""
    units: tuple[BudgetUnit, ...] = ("float", "bits")
    return next((unit for unit in units if text.replace(" ", "").startswith(f"{unit}<=")), None)


def _target(value: Target | str | None) -> Target | None:
    if value is not None and not isinstance(value, (str, Target)):
        raise InvalidParameterError("Goal", "target", type(value).__name__, "a target ('sqnr>=30'), a Target or None")
    return Target.parse(value, "Goal") if isinstance(value, str) else value


def _budget(value: Budget | str | None) -> Budget | None:
    if value is not None and not isinstance(value, (str, Budget)):
        raise InvalidParameterError("Goal", "budget", value, "'float<=N' or 'bits<=N', a Budget or None")
    if not isinstance(value, str):
        return value
    unit = _budget_unit(value)
    if unit is None:
        expected = "'float<=N' (sites kept in float) or 'bits<=N' (bits per weight)"
        raise InvalidParameterError("Goal", "budget", value, expected)
    return Budget.parse(value, unit, "Goal")


def _speed(value: object) -> SpeedBound | None:
    if value is not None and not isinstance(value, (str, SpeedBound)):
        expected = "a speed bound ('speedup>=1.5', 'latency<=30'), a SpeedBound or None"
        raise InvalidParameterError("Goal", "speed", type(value).__name__, expected)
    return SpeedBound.parse(value, "Goal") if isinstance(value, str) else value


def _confidence(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0.5 <= value < 1):
        raise InvalidParameterError("Goal", "confidence", value, "a one-sided confidence in [0.5, 1) (0.95), or None")


@attrs.frozen(kw_only=True)
class Goal:
    """What a planner aims at: a ``target`` to reach, or a ``budget`` to spend (then the best score of
    ``metric`` within it; :func:`qinsight.plan_formats` takes both: the fewest bits meeting the target
    within the budget); ``metric`` scores the outputs (a metric's name, or for :func:`qinsight.plan` a
    function of the float and quantized outputs); ``confidence``: the target held at this one-sided bound
    over the evaluation data, not at its mean (top-1 agreement: a Wilson bound over the rows;
    a language-model metric: a bound over the batch means); ``speed``: what the program must run at
    beside the target, where a plan lowers its configs (``"speedup>=1.5"``: at least 1.5x the float
    program's speed; ``"latency<=30"``: ms a batch).

    ``Goal.of`` takes the shorthands: ``"sqnr>=30"`` (a target), ``"float<=3"`` or ``"bits<=6"`` (a
    budget), a :class:`Target`, a :class:`Budget`, or a Goal; its fields take their text too
    (``Goal(target="top1>=0.93", confidence=0.95)``).
    """

    target: Target | None = attrs.field(default=None, converter=_target)
    budget: Budget | None = attrs.field(default=None, converter=_budget)
    metric: str | MetricFunction | None = None
    confidence: float | None = attrs.field(default=None, validator=_confidence)
    speed: SpeedBound | None = attrs.field(default=None, converter=_speed)

    def __attrs_post_init__(self) -> None:
        if self.confidence is not None and self.target is None:
            raise InvalidParameterError(
                "Goal", "confidence", self.confidence, "None without a target: a bound holds a target"
            )

    @classmethod
    def of(cls, value: object, owner: str) -> Goal:
        """``value`` as a Goal (``None``: an empty one, each planner's default)."""
        if value is None:
            return cls()
        if isinstance(value, Goal):
            return value
        if isinstance(value, Target):
            return cls(target=value)
        if isinstance(value, Budget):
            return cls(budget=value)
        if isinstance(value, str):
            unit = _budget_unit(value)
            return cls(budget=Budget.parse(value, unit, owner)) if unit else cls(target=Target.parse(value, owner))
        expected = "a Goal, a target ('sqnr>=30'), a budget ('float<=3', 'bits<=6'), a Target or a Budget"
        raise InvalidParameterError(owner, "goal", type(value).__name__, expected)


def _memory(value: object) -> int | None:
    return None if value is None else byte_count("Resources", "memory_budget", value)


def _shard(_instance: object, _attribute: object, value: object) -> None:
    if value not in (None, "distributed"):
        expected = '"distributed" (every rank of an initialized process group runs it alike), or None'
        raise InvalidParameterError("Resources", "shard", value, expected)


@attrs.frozen(kw_only=True)
class Resources:
    """What a plan may use to run, which never changes the plan: ``memory_budget``, what its simulation
    may hold in each process beyond one batch's values (bytes, or their text: ``"4GB"``, ``"512MiB"``;
    ``None``: 2 GiB), and ``shard``: ``"distributed"`` where every rank of an initialized process group
    (``torchrun``) runs the plan alike, each on a share of the evaluation batches."""

    memory_budget: int | None = attrs.field(default=None, converter=_memory)
    shard: Literal["distributed"] | None = attrs.field(default=None, validator=_shard)

    @classmethod
    def of(cls, value: object, owner: str) -> Resources:
        """``value`` as Resources (``None``: the defaults); anything else is ``owner``'s one error."""
        if value is None:
            return cls()
        if isinstance(value, Resources):
            return value
        expected = "a qinsight.types.Resources (memory_budget=, shard=) or None"
        raise InvalidParameterError(owner, "resources", type(value).__name__, expected)


@attrs.frozen(kw_only=True)
class Repairs:
    """What a plan may change in the model before it keeps anything in float, each measured for real and
    kept where it scores better: ``smoothing``, the Linears' inputs smoothed (SmoothQuant factors chosen
    by measured error; the config is then for ``qinsight.smoothed(model, plan)``), and
    ``bias_correction``, the default config's biases corrected (every layer stays int8; the config is
    then for ``qinsight.bias_corrected(model, plan)``). Neither by default."""

    smoothing: bool = attrs.field(default=False, validator=_flag)
    bias_correction: bool = attrs.field(default=False, validator=_flag)

    @classmethod
    def of(cls, value: object, owner: str) -> Repairs:
        """``value`` as Repairs (``None``: none); anything else is ``owner``'s one error."""
        if value is None:
            return cls()
        if isinstance(value, Repairs):
            return value
        expected = "a qinsight.types.Repairs (smoothing=, bias_correction=) or None"
        raise InvalidParameterError(owner, "repairs", type(value).__name__, expected)


GOAL_KEYWORDS: Final = ("target", "budget", "metric", "confidence")
DEPLOY_KEYWORDS: Final = ("flow", "backend", "quantizer", "qconfig_mapping", "lowered")
RESOURCE_KEYWORDS: Final = ("memory_budget",)
_RECORDS: Final = {
    "goal": ("Goal", GOAL_KEYWORDS),
    "deploy": ("Deployment", DEPLOY_KEYWORDS),
    "resources": ("Resources", RESOURCE_KEYWORDS),
}


def options(
    owner: str,
    goal: Goal | str | Target | Budget | None,
    deploy: Deployment | str | object | None,
    former: Mapping[str, Any],
    *,
    budget_unit: BudgetUnit = "float",
    takes: tuple[str, ...] = ("goal", "deploy"),
    resources: Resources | None = None,
) -> tuple[Goal, Deployment, Resources]:
    """``owner``'s goal, deployment and resources, from the records (or their shorthands) or from the
    former keywords in ``former``, each warned of (``takes``: the records ``owner`` has; ``budget_unit``:
    what its budget spends). Both for one record, or a keyword ``owner`` never took, is one
    :class:`InvalidParameterError` (Python's ``TypeError`` would name no replacement)."""
    given: dict[str, dict[str, Any]] = {"goal": {}, "deploy": {}, "resources": {}}
    for keyword, value in former.items():
        record = next((r for r, (_, keywords) in _RECORDS.items() if keyword in keywords), None)
        if record is None or record not in takes:
            raise InvalidParameterError(owner, keyword, value, f"no such argument (see help(qinsight.{owner}))")
        warnings.warn(
            f"{owner}({keyword}=...) is now {owner}({record}=...): qinsight.types.{_RECORDS[record][0]}"
            f"({keyword}=...) or its shorthand; the keyword goes in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        given[record][keyword] = value
    for name, value in (("goal", goal), ("deploy", deploy), ("resources", resources)):
        if given[name] and value is not None:
            keywords = ", ".join(f"{k}=" for k in given[name])
            expected = f"None beside {keywords} (one or the other)"
            raise InvalidParameterError(owner, name, type(value).__name__, expected)
    chosen = _former_goal(owner, given["goal"], budget_unit) if given["goal"] else Goal.of(goal, owner)
    if chosen.budget is not None and chosen.budget.unit != budget_unit:
        Budget.parse(chosen.budget, budget_unit, owner)  # one error naming the unit this planner spends
    deployment = Deployment.named(owner, **given["deploy"]) if given["deploy"] else Deployment.of(deploy, owner)
    if given["resources"]:
        memory = given["resources"]["memory_budget"]  # the keyword's own error, named as the user wrote it
        resources = Resources(memory_budget=byte_count(owner, "memory_budget", memory))
    return chosen, deployment, Resources.of(resources, owner)


def _former_goal(owner: str, given: Mapping[str, Any], unit: BudgetUnit) -> Goal:
    target, budget = given.get("target"), given.get("budget")
    aimed = Goal.of(target, owner)  # the target form of a budget ("float<=3") is a budget
    return Goal(
        target=aimed.target,
        budget=Budget.parse(budget, unit, owner) if budget is not None else aimed.budget,
        metric=given.get("metric"),
        confidence=given.get("confidence"),
    )


_BYTE_UNITS: Final = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def byte_count(owner: str, argument: str, value: object) -> int:
    """``value`` as a number of bytes: a whole number of them, or its text with a unit (``"2GB"``,
    ``"512 MiB"``); anything else, or under one MiB, is one :class:`InvalidParameterError`."""
    expected = "a number of bytes of at least 1 MiB, or its text with a unit ('2GB', '512MiB')"
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if isinstance(value, bool) or not (isinstance(value, int) or found):
        raise InvalidParameterError(owner, argument, value, expected)
    unit = _BYTE_UNITS.get(found.group(2).lower()) if found else 1
    if unit is None:
        raise InvalidParameterError(owner, argument, value, expected)
    count = int(float(found.group(1)) * unit) if found else int(str(value))
    if count < 2**20:
        raise InvalidParameterError(owner, argument, value, expected)
    return count


__all__ = [
    "DEPLOY_KEYWORDS",
    "GOAL_KEYWORDS",
    "RESOURCE_KEYWORDS",
    "Deployment",
    "Goal",
    "MetricFunction",
    "Repairs",
    "Resources",
    "byte_count",
    "options",
]
