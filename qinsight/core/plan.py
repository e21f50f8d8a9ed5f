"""A quantization plan: which sites to keep in float so that the quantized model reaches a quality target,
with every number it rests on measured on the user's evaluation data.

The plan is built by :func:`qinsight.plan` (``qinsight/planning/``); here are
only its immutable results, saved in report files like everything else:

- :class:`Target`: what "good enough" means (``sqnr>=30``, ``cosine>=0.995``,
  ``top1>=0.94``, a user's metric); :class:`Budget`: what a plan may spend instead
  (``float<=5``: the best score with at most 5 sites in float; ``bits<=6`` for format plans);
- :class:`SpeedBound`: what the program a plan ships must run at beside its target
  (``speedup>=1.5``: at least 1.5x the float program's speed; ``latency<=30``: ms a batch), and
  :class:`PlanPrograms`: the programs a lowered plan timed and sized;
- :class:`SuggestionCheck`: a report suggestion applied alone, its measured
  effect, and whether the plan kept it (and why not);
- :class:`SiteSensitivity`: the output metric with only this site in float, and only it quantized;
- :class:`PlanStep`: one site more quantized, its score, whether it stayed (the quality-vs-fraction curve);
- :class:`QuantPlan`: all of it, the final config as suggestions, and its score re-measured through the
  real flow next to the flow's default config.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from typing import Any, Literal

import attrs

from qinsight.core.bias import BiasCorrection
from qinsight.core.comparison import ProgramCost
from qinsight.core.equalization import EqualizationMapping
from qinsight.core.errors import InvalidParameterError, InvalidValueError, NotFoundError
from qinsight.core.fx_activations import FxActivations
from qinsight.core.metrics import higher_is_better, spec_of
from qinsight.core.notes import Note, NoteKind
from qinsight.core.sites import OpSite
from qinsight.core.smoothing import SmoothingMapping
from qinsight.core.suggestions import QuantSuggestion
from qinsight.core.verification import SuggestionKind, suggestion_kinds

_BOUND = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(>=|<=)\s*([-+0-9.eE]+)\s*$")  # name, operator, number
BudgetUnit = Literal["float", "bits"]
# What each unit of a budget counts, and the planner that spends it.
BUDGET_UNITS: dict[str, str] = {
    "float": "sites kept in float (qinsight.plan)",
    "bits": "mean bits per weight of the planned Linears (qinsight.plan_formats)",
}


def _finite(_instance: object, _attribute: object, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidValueError(f"a target's threshold or a budget's limit must be finite, not {value}")


def _bound(owner: str, argument: str, text: str, expected: str) -> tuple[str, bool, float]:
    """``text`` read as ``name>=number`` or ``name<=number``: the name, whether it is ``>=``, the number."""
    match = _BOUND.match(text)
    if match is None:
        raise InvalidParameterError(owner, argument, text, expected)
    name, operator, number = match.groups()
    try:
        value = float(number)
    except ValueError:
        raise InvalidParameterError(owner, argument, text, f"a number after {operator}, not {number!r}") from None
    if not math.isfinite(value):
        raise InvalidParameterError(owner, argument, text, "a finite number")
    return name, operator == ">=", value


@attrs.frozen(kw_only=True)
class Target:
    """A quality the plan must reach: ``metric >= threshold``, or ``<=`` for a lower-is-better metric.

    The direction is the metric's own, from the one table (:data:`qinsight.core.metrics.METRICS`); a
    metric of your own (a function, or a plugin's) is bounded the way its target is written.
    """

    metric: str
    threshold: float = attrs.field(validator=_finite)
    higher_is_better: bool = True

    @classmethod
    def parse(cls, text: str, owner: str = "plan") -> Target:
        """``"sqnr>=30"``, ``"cosine>=0.995"``, ``"top1>=0.94"`` (the CLI's form too); a metric of your own
        by its name (``"accuracy>=0.98"``). A known metric is bounded its way and within its range, else
        :class:`InvalidParameterError` naming ``owner``, the function the user called. A size
        (``"float<=5"``, ``"bits<=6"``) is a :class:`Budget`, not a target."""
        expected = "a target like 'sqnr>=30', 'cosine>=0.995' or 'top1>=0.94'"
        metric, higher, threshold = _bound(owner, "target", text, expected)
        if metric in BUDGET_UNITS:
            raise InvalidParameterError(owner, "target", text, f"a quality target: {text.strip()} is a budget=")
        spec = spec_of(metric)
        if spec is not None:
            wanted = ">=" if spec.higher_is_better else "<="
            if higher != spec.higher_is_better:
                number = text.split(">=" if higher else "<=")[1].strip()
                raise InvalidParameterError(
                    owner, "target", text, f"{metric}{wanted}{number}: {metric} is bounded with {wanted}"
                )
            if not spec.admits(threshold):
                raise InvalidParameterError(owner, "target", text, f"a {metric} threshold {spec.describe_range()}")
        return cls(metric=metric, threshold=threshold, higher_is_better=higher)

    def met(self, score: float) -> bool:
        """Whether ``score`` reaches the target (never for a NaN score)."""
        if math.isnan(score):
            return False
        return score >= self.threshold if self.higher_is_better else score <= self.threshold

    def __str__(self) -> str:
        return f"{self.metric}{'>=' if self.higher_is_better else '<='}{self.threshold:g}"


@attrs.frozen(kw_only=True)
class Budget:
    """What a plan may spend, where a :class:`Target` is what it must reach: at most ``limit`` of ``unit``.

    ``"float"``: sites kept in float (:func:`qinsight.plan` takes the best score of its metric within
    it); ``"bits"``: a mean of bits per weight of the planned Linears, scales included
    (:func:`qinsight.plan_formats`).
    """

    unit: BudgetUnit
    limit: float = attrs.field(validator=_finite)

    @classmethod
    def parse(cls, value: str | float | Budget, unit: BudgetUnit, owner: str) -> Budget:
        """``"float<=5"`` or ``"bits<=6"``, or a number in ``unit`` (the one ``owner``, the planner the user
        called, spends); a budget of another unit, or a limit it cannot take, is one
        :class:`InvalidParameterError`."""
        expected = f"'{unit}<=N': at most N {BUDGET_UNITS[unit]}" + (", N a whole number" if unit == "float" else "")
        found: str
        if isinstance(value, Budget):
            found, limit = value.unit, value.limit
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found, limit = unit, float(value)
        elif isinstance(value, str):
            found, higher, limit = _bound(owner, "budget", value, expected)
            if higher:
                raise InvalidParameterError(owner, "budget", value, expected)
        else:
            raise InvalidParameterError(owner, "budget", type(value).__name__, expected)
        if found != unit:
            other = f" ({found}<=N is {BUDGET_UNITS[found]})" if found in BUDGET_UNITS else ""
            raise InvalidParameterError(owner, "budget", str(value), expected + other)
        whole = math.isfinite(limit) and limit >= 0 and limit == int(limit)
        if not (whole if unit == "float" else math.isfinite(limit) and limit > 0):
            raise InvalidParameterError(owner, "budget", str(value), expected)
        return cls(unit=unit, limit=limit)

    @property
    def sites(self) -> int:
        """A float budget's sites (kept in float, at most)."""
        return int(self.limit)

    def __str__(self) -> str:
        return f"{self.unit}<={self.limit:g}"


SpeedMeasure = Literal["speedup", "latency"]
# What each speed bound measures of the program a plan ships, and its operator.
SPEED_MEASURES: dict[str, str] = {
    "speedup": ">=: times the float program's speed, each lowered alike",
    "latency": "<=: milliseconds a batch",
}


def _positive(_instance: object, _attribute: object, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InvalidValueError(f"a speed bound's limit must be a positive number, not {value}")


@attrs.frozen(kw_only=True)
class PlanPrograms:
    """The programs a lowered plan timed (the median wall time per evaluation batch, after a first call
    that is not timed) and sized: its config's (``planned``), the flow's default config's
    (``default``), and the float model lowered the same way (``float_model``)."""

    planned: ProgramCost
    default: ProgramCost
    float_model: ProgramCost

    @property
    def speedup(self) -> float:
        """The float program's time over the plan's: above 1, the plan's program is faster."""
        return self.float_model.latency_ms / self.planned.latency_ms if self.planned.latency_ms > 0 else math.nan

    @property
    def default_speedup(self) -> float:
        """The float program's time over the default int8 program's."""
        return self.float_model.latency_ms / self.default.latency_ms if self.default.latency_ms > 0 else math.nan

    @property
    def slower_than_float(self) -> bool:
        return self.planned.latency_ms > self.float_model.latency_ms

    def describe(self) -> str:
        """One line: the plan's program's time and size, against the float and the default int8 programs."""
        planned, floated, default = self.planned, self.float_model, self.default
        pace = "SLOWER than" if self.slower_than_float else "faster than"
        return (
            f"the program runs {planned.latency_ms:.3g} ms a batch, {self.speedup:.2f}x the float program's speed "
            f"({pace} its {floated.latency_ms:.3g} ms; the default int8 program: {default.latency_ms:.3g} ms, "
            f"{self.default_speedup:.2f}x), {_megabytes(planned.size_bytes)} "
            f"(float {_megabytes(floated.size_bytes)}, default {_megabytes(default.size_bytes)})"
        )


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.3g} MB"


@attrs.frozen(kw_only=True)
class SpeedBound:
    """What the program a plan ships must run at, beside its quality target: at least ``limit`` times
    the float program's speed (``"speedup>=1.5"``), or at most ``limit`` milliseconds a batch
    (``"latency<=30"``), timed as the plan times programs (:class:`PlanPrograms`)."""

    measure: SpeedMeasure
    limit: float = attrs.field(validator=_positive)

    @classmethod
    def parse(cls, text: str, owner: str = "plan") -> SpeedBound:
        """``"speedup>=1.5"`` or ``"latency<=30"`` (ms; a trailing ``ms`` is read too), else one
        :class:`InvalidParameterError` naming ``owner``."""
        expected = "a speed bound like 'speedup>=1.5' (times the float program's speed) or 'latency<=30' (ms a batch)"
        given = text.strip()
        measure, higher, limit = _bound(owner, "speed", given.removesuffix("ms") if given else given, expected)
        if measure not in SPEED_MEASURES or higher != (measure == "speedup") or not limit > 0:
            raise InvalidParameterError(owner, "speed", text, expected)
        return cls(measure="speedup" if measure == "speedup" else "latency", limit=limit)

    def met(self, programs: PlanPrograms) -> bool:
        if self.measure == "speedup":
            return programs.speedup >= self.limit
        return programs.planned.latency_ms <= self.limit

    def shortfall(self, programs: PlanPrograms) -> str:
        """How far the plan's program is from the bound, said (``""``: it meets it)."""
        if self.met(programs):
            return ""
        if self.measure == "speedup":
            return f"its program runs at {programs.speedup:.2f}x the float program's speed, {self} asked"
        return f"its program runs {programs.planned.latency_ms:.3g} ms a batch, {self} asked"

    def __str__(self) -> str:
        return f"speedup>={self.limit:g}" if self.measure == "speedup" else f"latency<={self.limit:g}ms"


@attrs.frozen(kw_only=True)
class SuggestionCheck:
    """One report suggestion, measured alone and among the others.

    ``before`` is the flow's default config; ``alone`` the default with only
    this suggestion; ``together`` the default with every kept suggestion and
    ``without`` the same without this one, so ``effect`` is what it adds
    among the others (suggestions that only help together, such as keeping
    both ends of a residual stream in float, show it there). ``kept`` says
    whether the plan starts from it; ``reason`` says why not, or why it could
    not be measured (then its scores are NaN and it is kept, marked so).

    ``kinds`` is what the change is, for code to act on; ``change`` says it in words. ``why`` is the
    kind of the ``reason`` (``None`` where a simulated check kept it and there is nothing to add). A
    change to the whole model rather than one site (how FX observes activations) has no ``fqn``.
    """

    fqn: str
    change: str
    kinds: tuple[SuggestionKind, ...] = ()
    before: float
    alone: float
    together: float = math.nan
    without: float = math.nan
    kept: bool
    reason: str = ""
    why: NoteKind | None = None

    @classmethod
    def of(cls, suggestion: QuantSuggestion, **measured: Any) -> SuggestionCheck:
        """The check of ``suggestion``: its site, its change in words and its kinds, with ``measured``
        (``before``, ``alone``, ``kept``...)."""
        return cls(fqn=suggestion.fqn, change=suggestion.describe(), kinds=suggestion_kinds(suggestion), **measured)

    @property
    def measured(self) -> bool:
        return not math.isnan(self.alone)

    @property
    def site(self) -> str:
        """Where the change is made, as shown: its site, or the model's activations."""
        return self.fqn or "(activations)"

    @property
    def effect(self) -> float:
        """What it adds among the other kept suggestions (its effect alone where that is all there is)."""
        if math.isnan(self.together) or math.isnan(self.without):
            return self.alone - self.before
        return self.together - self.without


@attrs.frozen(kw_only=True)
class SearchedOrder:
    """One order the search took the sites in, simulated (a top-1 target's two: by the output's noise and
    by the top-1 margins'): the share of the layers' parameters it quantized, its score, whether it met
    the target, and whether the plan ``taken`` it (of those meeting it, the one quantizing most)."""

    order: str
    quantized_fraction: float = attrs.field(validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    score: float
    met: bool
    taken: bool


@attrs.frozen(kw_only=True)
class SiteSensitivity:
    """How much one site matters to the model's output, measured end to end.

    ``float_only``: the score with every site quantized but this one;
    ``quantized_only``: with only this one quantized. ``gain`` is
    ``float_only`` minus the all-quantized score; ``parameters`` is the weight
    count the site would keep in float.
    """

    fqn: str
    kind: str
    parameters: int = attrs.field(validator=attrs.validators.ge(0))
    float_only: float
    quantized_only: float
    gain: float


STEP_MODES = ("", "static", "dynamic")
STAGES = ("start", "curve", "refine", "budget")


@attrs.frozen(kw_only=True)
class PlanStep:
    """One site quantized (``fqn``) and the score the simulation measured then.

    ``stage`` ``"start"``: every candidate in float (``fqn == ""``);
    ``"curve"``: the site added to all before it (the quality-vs-fraction
    curve), ``kept`` if it is in the longest prefix that meets the target;
    ``"refine"``: a later site tried alone on top of that prefix, ``kept`` if
    the target still held (else it stays in float); ``"budget"``: one more
    site in float, for ``float<=N`` targets. ``quantized_fraction`` is the
    share of layer parameters quantized at that point. ``mode`` is what the
    step made of the site: ``"dynamic"`` (a Linear's weights int8, its input
    quantized per batch) or ``"static"``; a Linear can take both steps, dynamic
    first. ``""``: the mode its suggestions give (files before 1.8).
    ``settled_after``: N, a refinement step certain to miss on its first N
    evaluation batches (stopped there): ``score`` is the best the rest could
    give (them as the float model's own outputs); 0: scored on every batch.
    """

    fqn: str
    score: float
    kept: bool
    quantized_fraction: float = attrs.field(validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    stage: str = attrs.field(default="curve", validator=attrs.validators.in_(STAGES))
    mode: str = attrs.field(default="", validator=attrs.validators.in_(STEP_MODES))
    settled_after: int = attrs.field(default=0, validator=attrs.validators.ge(0))


@attrs.frozen(kw_only=True)
class StageTime:
    """One stage of a plan and the wall seconds it took (``real_configs`` of them quantizing a config
    for real: prepare, calibrate, convert and run, lowered too where the plan scores programs)."""

    stage: str
    seconds: float = attrs.field(validator=attrs.validators.ge(0.0))
    real_configs: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    real_seconds: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))


@attrs.frozen(kw_only=True)
class PlanCost:
    """Where a plan's time went: each stage in order (:class:`StageTime`), and the whole forwards the
    simulation ran (a partial run counts its share of the graph)."""

    stages: tuple[StageTime, ...] = ()
    simulated_forwards: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))

    @property
    def seconds(self) -> float:
        return sum(stage.seconds for stage in self.stages)

    @property
    def real_configs(self) -> int:
        return sum(stage.real_configs for stage in self.stages)

    @property
    def real_seconds(self) -> float:
        return sum(stage.real_seconds for stage in self.stages)

    def describe(self) -> str:
        """One line: the time, the stages' shares, the configs quantized for real and the forwards."""
        shares = ", ".join(f"{stage.stage} {stage.seconds:.0f} s" for stage in self.stages)
        return (
            f"{self.seconds:.0f} s ({shares}); {self.real_configs} configs quantized for real in "
            f"{self.real_seconds:.0f} s, {self.simulated_forwards:.0f} simulated forwards of the data"
        )


def float_islands(order: Sequence[str], floats: Collection[str]) -> int:
    """The runs of consecutive sites of ``order`` (the graph's) that are in ``floats``."""
    kept = [site in floats for site in order]
    return sum(1 for index, floated in enumerate(kept) if floated and (index == 0 or not kept[index - 1]))


def _direction(plan: QuantPlan) -> bool:
    return plan.target.higher_is_better if isinstance(plan.target, Target) else higher_is_better(plan.metric)


@attrs.frozen(kw_only=True)
class QuantPlan:
    """The sites to keep in float so that the quantized model reaches ``target``, and the evidence.

    ``default_score`` is the flow's default config and ``verified_score`` the
    plan's config, both quantized through the real flow (prepare, calibrate,
    convert) and measured on the evaluation data (``held_out_score``: on the held-out data, where
    given; ``reached`` then needs both); ``steps`` are the
    simulation's scores along the way; ``quantized_fraction`` is the share of
    the layers' parameters the final config quantizes. ``suggestions`` is the config the plan
    ends with (the kept report suggestions and one ``keep_float`` per kept
    site); ``sites`` are the sites they name (all of them where ``fx_activations`` is set: its
    observers follow the graph's edges), so the config can be rebuilt from the plan alone.
    ``agreement`` is the Spearman correlation between the cheap local-error ranking and the
    measured gains (NaN where not computed). ``fx_activations`` is how an FX plan's config
    observes activations (measured against torch's way; ``None`` where torch's scored better, or
    in PT2E). ``smoothing`` is what the plan did to the model before quantizing it (none
    unless asked): its config is for ``qinsight.smoothed(model, plan)`` (``bias_correction``: for
    ``qinsight.bias_corrected(model, plan)``), and its
    sites are named as in that model; ``default_score`` is the model as given. ``lowered`` names
    the runtime that ran every real score where the plan scored the program lowered from each config
    (``plan(..., deploy=Deployment(lowered=True))``: ``"ExecuTorch 1.5.1 runtime, XNNPACK delegate"``); empty: the
    reference model. ``starts_from`` names the user's quantizer a plan made with ``quantizer=`` starts
    from: its config is that quantizer with the plan's float sites stripped
    (``qinsight.pt2e_quantizer(plan, quantizer=q)``). ``confidence``: a top1 target was held at the
    lower end of this one-sided Wilson interval over the evaluation rows (``Goal.confidence``),
    so ``verified_score`` meets a stricter threshold than ``target``'s; ``None``: at the score itself.
    """

    flow: str
    backend: str
    metric: str
    target: Target | Budget  # what the plan had to reach, or what it could spend (the best score within it)
    reached: bool
    default_score: float
    verified_score: float
    held_out_score: float = math.nan  # the config as converted, on data the search never chose on (NaN: none given)
    steps: tuple[PlanStep, ...] = ()
    quantized_fraction: float = attrs.field(default=1.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    checks: tuple[SuggestionCheck, ...] = ()
    sensitivities: tuple[SiteSensitivity, ...] = ()
    agreement: float = math.nan
    suggestions: tuple[QuantSuggestion, ...] = ()
    sites: tuple[OpSite, ...] = ()
    evaluations: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    notes: tuple[Note, ...] = ()
    smoothing: SmoothingMapping = SmoothingMapping()
    bias_correction: BiasCorrection = BiasCorrection()  # applied before (plan(bias_correction=True))
    fx_activations: FxActivations | None = None
    lowered: str = ""  # what ran the real scores: the lowered program's runtime; empty: the reference model
    starts_from: str = ""  # the user's quantizer the plan keeps sites float on top of (its class); empty: qinsight's
    confidence: float | None = None  # the top1 target held at this one-sided bound over the rows; None: the score
    orders: tuple[SearchedOrder, ...] = ()  # the orders the search compared (top-1: two); empty: it had one
    # the direction of the plan's scores, as it compared them (a plugin metric's own, which a file keeps
    # where the plugin is not installed); absent before 4.0: the target's, or the one table's for a budget
    higher_is_better: bool = attrs.field(default=attrs.Factory(lambda plan: _direction(plan), takes_self=True))
    cost: PlanCost | None = None  # where its time went; None: a plan saved before 4.3
    programs: PlanPrograms | None = None  # lowered=True: its program, the default's, the float one's; None: not
    speed: SpeedBound | None = None  # the speed its program had to reach beside the target; None: none asked
    # the runs of consecutive sites kept in float, in the graph's order (each one splits the program
    # with a dequantize before it and a quantize after it); 0: none, or a plan saved before 4.4
    float_islands: int = attrs.field(default=0, validator=attrs.validators.ge(0))

    @property
    def aim(self) -> str:
        """What the plan had to reach, said: its target (or budget), and beside it the speed bound asked."""
        return f"{self.target}" + (f" and {self.speed}" if self.speed is not None else "")

    @property
    def kept_float(self) -> tuple[str, ...]:
        """The sites the plan keeps in float (the kept suggestions' and the search's; not the
        smoothing's divisions, which are float as part of it)."""
        divisions = set(self.smoothing.divisions)
        return tuple(s.fqn for s in self.suggestions if s.keep_float and s.fqn not in divisions)

    def equalization_mapping(self) -> EqualizationMapping:
        """The equalizations the plan keeps (measured for real in FX), for ``prepare_fx``'s
        ``_equalization_config`` (:func:`qinsight.equalization_config`)."""
        return EqualizationMapping.of(self.suggestions)

    def sensitivity(self, fqn: str) -> SiteSensitivity:
        for found in self.sensitivities:
            if found.fqn == fqn:
                return found
        raise NotFoundError("sensitivity measured for", fqn, (s.fqn for s in self.sensitivities))
