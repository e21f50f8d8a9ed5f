"""``qinsight.plan_formats``: a torchao ``quantize_`` format for every Linear, so that the model reaches a
quality target with as few bits per weight as the search can get, or the best quality within a budget.

The stages, each measured for real (``quantize_`` in place, the float weights put back after):

1. **Costs**: each Linear alone in each of its formats, every other layer float, scored on the ranking
   part of the search data; its *damage* (:meth:`Scorer.damage`) adds up over layers. The search data's
   batches alternate between the ranking part and the sizing part (one batch: both), so the sizes
   below are chosen on tokens the ranking never saw: a ranking fitted to its own tokens' chance
   makes cheap-looking layers that are not, and scored on those same tokens it would not show.
2. **Order** (:mod:`.ladders`): the moves down each layer's ladder of formats, cheapest damage per bit
   saved first.
3. **Other orders** (:mod:`.proxies`): the same moves ranked by the Fisher proxy (one backward pass)
   and by the activation-weighted weight error (``compare_orders``).
4. **Search**: along each order, the longest prefix whose real score meets the target (bisection), no
   shorter than the budget needs. A language-model metric is held to the target at the pessimistic end
   of its ``confidence`` interval over the search tokens (:func:`.scores.pessimistic_bound`), so that
   text like the search text meets it too, not only the tokens the search happened to see; the plan is
   the best of them on the search data (the target met with
   the fewest bits, else the best score). Each ranking is a guess at which layers matter; quantizing
   along each and keeping what scored best is a measurement.
5. **Held out**: the plan, the uniform formats and the curve scored again on data the search never saw;
   the plan claims ``reached`` only where both parts meet the target. Every order is also scored at
   the plan's bits, on both parts (the rankings table).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs
from torch import nn

from qinsight.apply.torchao import applied, state_bytes, torchao_config
from qinsight.apply.trial import model_outputs
from qinsight.core.errors import InvalidParameterError
from qinsight.core.formats import CurvePoint, FormatCost, FormatPlan, OrderCheck, WeightFormat, mean_bits
from qinsight.core.notes import Note, NoteKind
from qinsight.core.options import Goal, options
from qinsight.core.plan import Budget, Target
from qinsight.core.progress import Progress
from qinsight.frontends.base import eval_mode
from qinsight.planning.formats import ladders, proxies
from qinsight.planning.formats.ladders import Move, Rungs
from qinsight.planning.scores import PER_POSITION, SCORES, Scorer, held_out_miss, metric_direction, scored_metric

CURVE_POINTS = 6  # sizes along the plan's order quantized for real, besides the plan itself
MEASURED = "measured (end to end)"  # the order of each layer's own measured damage


@attrs.frozen(kw_only=True)
class FormatGoal:
    """The formats to choose from and what the plan must reach, checked (no data needed: the command line
    checks them before it loads a model)."""

    formats: tuple[WeightFormat, ...]
    target: Target | None
    budget: Budget | None
    metric: str
    confidence: float | None = None  # held to the target: the score's pessimistic bound (language-model metrics)


DEFAULT_GOAL: Final = Goal(target=Target.parse("perplexity<=1.05"), confidence=0.95)


def _goal(goal: Goal | str | Target | Budget | None, former: dict[str, Any]) -> Goal:
    """``goal`` (default :data:`DEFAULT_GOAL`), or the former keywords as they were: the target
    ``perplexity<=1.05`` unless given, held at the 0.95 bound where its metric is a language model's."""
    if not former:
        return DEFAULT_GOAL if goal is None else Goal.of(goal, "plan_formats")
    given = {"target": "perplexity<=1.05", **former}
    aim, _deploy, _resources = options("plan_formats", goal, None, given, budget_unit="bits", takes=("goal",))
    metric = aim.metric if isinstance(aim.metric, str) else aim.target.metric if aim.target is not None else ""
    if "confidence" not in former and aim.target is not None and metric in PER_POSITION:
        aim = attrs.evolve(aim, confidence=0.95)
    return aim


def format_goal(formats: Iterable[str] | str, aim: Goal) -> FormatGoal:
    """The formats and the goal of a format plan, checked: a target, a budget in bits, or both; the metric
    the target's (SQNR for a budget alone); a confidence bound for a language-model target alone."""
    parsed = tuple(WeightFormat.parse(f) for f in (formats.split(",") if isinstance(formats, str) else formats))
    if not parsed or len(set(parsed)) != len(parsed):
        raise InvalidParameterError("plan_formats", "formats", [str(f) for f in parsed], "one or more distinct formats")
    goal, limit, metric, confidence = aim.target, aim.budget, aim.metric, aim.confidence
    if limit is not None:
        limit = Budget.parse(limit, "bits", "plan_formats")
    if not (metric is None or isinstance(metric, str)):
        expected = f"a metric's name: one of {', '.join(SCORES)}, or a plugin metric (qinsight.metrics)"
        raise InvalidParameterError("plan_formats", "metric", type(metric).__name__, expected)
    if goal is None and limit is None:
        raise InvalidParameterError(
            "plan_formats", "target", None, "a target ('perplexity<=1.05'), a budget ('bits<=6') or both"
        )
    name = metric or (goal.metric if goal is not None else "sqnr")
    scored_metric("plan_formats", name, goal, given=metric is not None, functions=False)
    if goal is not None and name != goal.metric:
        raise InvalidParameterError("plan_formats", "metric", name, f"the target's own metric, {goal.metric!r}")
    if confidence is not None and name not in PER_POSITION:
        expected = f"None for a {name} target: a bound over the batch means holds a language-model metric's"
        raise InvalidParameterError("plan_formats", "confidence", confidence, expected)
    torchao_config(parsed[0])  # torchao missing: one error, before any forward
    return FormatGoal(formats=parsed, target=goal, budget=limit, metric=name, confidence=confidence)


@attrs.frozen(kw_only=True)
class FormatRequest:
    """What :func:`plan_formats` was asked, checked before any forward: the goal, and the data split into
    the part the layers are ranked on, the part the sizes are chosen on and the part held out."""

    goal: FormatGoal
    rank: tuple[Any, ...]
    search: tuple[Any, ...]
    held_out: tuple[Any, ...]
    orders: bool

    @property
    def cross_fitted(self) -> bool:
        """Whether the ranking and the sizes were chosen on different batches."""
        return self.rank is not self.search  # one batch: the same tuple, both parts


def format_request(
    goal: FormatGoal, evaluation_data: Iterable[Any], held_out_data: Iterable[Any] | None, orders: bool
) -> FormatRequest:
    batches = tuple(evaluation_data)
    if not batches:
        raise InvalidParameterError("plan_formats", "evaluation_data", "no batches", "at least one batch")
    held = tuple(held_out_data) if held_out_data is not None else batches[(len(batches) + 1) // 2 :]
    search = batches if held_out_data is not None else batches[: (len(batches) + 1) // 2]
    rank, size = (search[0::2], search[1::2]) if len(search) > 1 else (search, search)
    return FormatRequest(goal=goal, rank=rank, search=size, held_out=held, orders=orders)


class _Measure:
    """Assignments quantized for real in place and scored: on the search data, and on the held-out data
    where asked. Each assignment runs once per part (the bisection's ends, the plan, the uniform formats
    and the curve often coincide); every run counted."""

    def __init__(self, model: nn.Module, layers: Sequence[Rungs], request: FormatRequest) -> None:
        self.model, self.layers, self.request = model, tuple(layers), request
        self.search = self._scorer(request.search)
        self.ranking = self._scorer(request.rank) if request.cross_fitted else self.search
        self.held = self._scorer(request.held_out) if request.held_out else None
        self.runs = 0
        self._scores: dict[
            tuple[tuple[tuple[str, str], ...], bool], tuple[float, float]
        ] = {}  # (assignment, held out) -> score, bound
        self._stored: dict[tuple[tuple[str, str], ...], int] = {}  # assignment -> bytes of its weights as stored

    def _scorer(self, batches: tuple[Any, ...]) -> Scorer:
        """The goal's metric against the float model's outputs of ``batches``."""
        return Scorer(model_outputs(self.model, batches), self.request.goal.metric, self.request.goal.metric, batches)

    def outputs(self, formats: dict[str, str], batches: Sequence[Any]) -> list[Any]:
        return self._run(formats, batches, None)

    def score(self, formats: dict[str, str], held_out: bool = False) -> tuple[float, float]:
        """The score of ``formats`` and its pessimistic bound at the goal's confidence (NaN: none)."""
        assignment = tuple(sorted(formats.items()))
        if (assignment, held_out) not in self._scores:
            scorer = self.held if held_out and self.held is not None else self.search
            data = self.request.held_out if held_out else self.request.search
            self._scores[(assignment, held_out)] = scorer.bounded(
                self._run(formats, data, assignment), self.request.goal.confidence
            )
        return self._scores[(assignment, held_out)]

    def _run(
        self, formats: dict[str, str], batches: Sequence[Any], assignment: tuple[tuple[str, str], ...] | None
    ) -> list[Any]:
        """The outputs of ``batches`` with ``formats`` applied; for an ``assignment`` a point is made of,
        the bytes its weights take as stored too, read once."""
        with applied(self.model, formats):
            self.runs += 1
            if assignment is not None and assignment not in self._stored:
                self._stored[assignment] = state_bytes(self.model, [layer.fqn for layer in self.layers])
            return model_outputs(self.model, batches)

    def point(self, label: str, formats: dict[str, str], held_out: bool = False) -> CurvePoint:
        score, bound = self.score(formats)
        held = self.score(formats, held_out=True)[0] if held_out and self.held is not None else math.nan
        bits = mean_bits(ladders.layer_formats(self.layers, formats))
        stored = self._stored[tuple(sorted(formats.items()))]
        return CurvePoint(label=label, mean_bits=bits, state_bytes=stored, score=score, held_out=held, bound=bound)

    def met(self, point: CurvePoint) -> bool:
        """Whether ``point`` meets the target on the search data as the search holds it: at its bound
        where the goal has a confidence, else its score."""
        target = self.request.goal.target
        return target is None or target.met(point.score if math.isnan(point.bound) else point.bound)


def plan_formats(
    model: nn.Module,
    evaluation_data: Iterable[Any],
    *,
    formats: Iterable[str] = ("int8", "int4_g32"),
    goal: Goal | str | Target | Budget | None = None,
    held_out_data: Iterable[Any] | None = None,
    compare_orders: bool = True,
    progress: Progress | None = None,
    **former: Any,
) -> FormatPlan:
    """The torchao format of every Linear of ``model``: the fewest bits per weight whose real score meets
    ``target``, within ``budget`` where given; with a budget alone, the best score within it.

    The search's batches alternate between ranking the layers (each one's cost) and choosing the sizes,
    so that the scores it keeps are of tokens the ranking never saw (with one batch, both are chosen on
    it, and a note says so). ``qinsight.quantize(model, plan)``, or ``quantize_(model,
    qinsight.fqn_to_config(plan))``, applies it.

    Args:
        model: the float model; it is not changed.
        evaluation_data: the batches the search chooses on.
        formats: names (:class:`~qinsight.core.formats.WeightFormat`: ``int8``, ``int8_dynamic``,
            ``float8``, ``int4_g32``, ``int4_dynamic_g32``, ``float``).
        goal: a :class:`~qinsight.core.options.Goal`, or its shorthand: a target (``"kl<=0.02"``,
            ``"sqnr>=30"``; the perplexity ratio to the float model on the batches' own next tokens,
            ``"perplexity<=1.05"``), or a budget (``"bits<=6"``: the mean bits per weight, scales
            included); a Goal may hold both. ``Goal.metric``: the score's metric where no target names
            one. ``Goal.confidence``, with a language-model target: the search holds it at the
            pessimistic end of the score's one-sided interval over the sizing tokens (``None``: at the
            score itself, which text the search did not see often misses). Default:
            ``Goal(target=perplexity<=1.05, confidence=0.95)``.
        held_out_data: the batches the plan is scored on again (default: the second half of
            ``evaluation_data``'s batches, the search keeping the first).
        compare_orders: the measured ranking compared with the Fisher and activation-weighted ones
            (:mod:`.proxies`), the best on the search data kept.
        progress: called at each stage (the command line's progress line).
        former: ``target=``, ``budget=``, ``metric=``, ``confidence=`` (now ``goal``'s), for one release,
            with a ``DeprecationWarning`` (a target given so keeps the former default bound, 0.95, where
            its metric is a language model's).

    Returns:
        The :class:`FormatPlan`: a format per Linear, its mean bits, the search and held-out scores.

    Raises:
        InvalidParameterError: an argument outside what it takes, checked before the model runs.
    """
    request = format_request(format_goal(formats, _goal(goal, former)), evaluation_data, held_out_data, compare_orders)
    report = progress or (lambda _stage, _done, _total: None)
    with eval_mode(model):
        layers, notes = ladders.ladders(model, request.goal.formats)
        if not layers:
            raise InvalidParameterError(
                "plan_formats", "model", type(model).__name__, "a model with a Linear the formats fit"
            )
        measure = _Measure(model, layers, request)
        costs = _costs(measure, report)
        orders: dict[str, Sequence[Move]] = {
            MEASURED: ladders.ordered_moves(layers, {(c.fqn, c.format): c.damage for c in costs})
        }
        if request.orders:
            orders.update(_proxy_orders(measure))
        searched = {name: _searched(measure, moves, report) for name, moves in orders.items()}
        name = _best_order(measure, orders, searched)
        return _assembled(request, measure, costs, orders, name, searched, notes, report)


def _costs(measure: _Measure, report: Progress) -> tuple[FormatCost, ...]:
    """Each layer alone in each of its formats (``float`` costs nothing), measured on the ranking data."""
    wanted = [(layer.fqn, fmt.name) for layer in measure.layers for fmt in layer.formats if not fmt.is_float]
    found = []
    for done, (fqn, name) in enumerate(wanted):
        report("measuring each layer in each format", done, len(wanted))
        results = measure.outputs({fqn: name}, measure.request.rank)
        found.append(
            FormatCost(fqn=fqn, format=name, damage=measure.ranking.damage(results), score=measure.ranking(results))
        )
    report("measuring each layer in each format", len(wanted), len(wanted))
    return tuple(found)


def _searched(measure: _Measure, moves: Sequence[Move], report: Progress) -> tuple[int, tuple[Note, ...]]:
    """How many moves the plan takes: the most whose real score meets the target (bisection over the
    order: the score falls along it), no fewer than the budget needs."""
    request, layers = measure.request, measure.layers
    fewest = ladders.within(layers, moves, request.goal.budget.limit) if request.goal.budget is not None else 0
    if request.goal.target is None:
        return fewest, ()
    report("searching", 0, 0)

    def meets(taken: int) -> bool:
        return measure.met(measure.point("", ladders.assignment(layers, moves, taken)))

    if not meets(0):
        said = f"every layer on its format with the most bits misses {request.goal.target}: no plan reaches it"
        return fewest, (Note(NoteKind.UNREACHABLE, said),)
    low, high = 0, len(moves)  # low meets; the answer lies in [low, high]
    if meets(high):
        low = high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if meets(middle) else (low, middle)
    if low < fewest:
        said = f"the budget {request.goal.budget} needs {fewest} moves down; the target holds for {low} only"
        return fewest, (Note(NoteKind.BUDGET_OVER_TARGET, said),)
    return low, ()


def _best_order(
    measure: _Measure, orders: Mapping[str, Sequence[Move]], searched: Mapping[str, tuple[int, tuple[Note, ...]]]
) -> str:
    """The order whose searched size scored best on the search data: the target met within the budget
    with the fewest bits (then the better score), else the better score (then the fewer bits)."""
    goal = measure.request.goal
    higher = goal.target.higher_is_better if goal.target is not None else metric_direction(goal.metric)

    def rank(name: str) -> tuple[bool, float, float]:
        point = measure.point(name, ladders.assignment(measure.layers, orders[name], searched[name][0]))
        fits = goal.budget is None or point.mean_bits <= goal.budget.limit + 1e-9
        better = point.score if higher else -point.score
        if fits and measure.met(point):
            return (True, -point.mean_bits, better) if goal.target is not None else (True, better, -point.mean_bits)
        return (False, better, -point.mean_bits)

    return max(orders, key=lambda name: (rank(name), name == MEASURED))


def _assembled(
    request: FormatRequest,
    measure: _Measure,
    costs: tuple[FormatCost, ...],
    orders: Mapping[str, Sequence[Move]],
    order: str,
    searched_all: Mapping[str, tuple[int, tuple[Note, ...]]],
    notes: tuple[Note, ...],
    report: Progress,
) -> FormatPlan:
    report("verifying", 0, 0)
    layers, moves, (taken, search_notes) = measure.layers, orders[order], searched_all[order]
    formats = ladders.assignment(layers, moves, taken)
    chosen = measure.point("plan", formats, held_out=True)
    uniform = tuple(
        measure.point(f"uniform {fmt}", ladders.uniform(layers, fmt), held_out=True) for fmt in request.goal.formats
    )
    sizes = sorted({round(len(moves) * i / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)} - {taken})
    curve = tuple(measure.point(f"{k} of {len(moves)} moves", ladders.assignment(layers, moves, k)) for k in sizes)
    checks = _orders(measure, orders, searched_all, order, chosen) if request.orders else ()
    said = f"the plan follows the {order} ranking: quantized along each ranking, it scored best on the search data"
    followed = (Note(NoteKind.RANKING, said),) if order != MEASURED else ()
    plan = FormatPlan(
        formats=tuple(f.name for f in request.goal.formats),
        metric=request.goal.metric,
        target=request.goal.target,
        budget=request.goal.budget,
        reached=False,
        layers=ladders.layer_formats(layers, formats),
        chosen=chosen,
        float_score=measure.search(measure.search.reference),
        uniform=uniform,
        curve=tuple(
            sorted(
                (*curve, attrs.evolve(chosen, label=f"{taken} of {len(moves)} moves (the plan)")),
                key=lambda p: -p.mean_bits,
            )
        ),
        costs=costs,
        orders=checks,
        evaluations=measure.runs,
        notes=notes
        + search_notes
        + followed
        + _bound_note(request, chosen)
        + _fitting_note(request)
        + _held_out_note(request, measure, chosen)
        + _measured_notes(measure, chosen),
        order=order,
        confidence=request.goal.confidence,
    )
    return attrs.evolve(plan, reached=plan.target_held and plan.budget_held)


def _fitting_note(request: FormatRequest) -> tuple[Note, ...]:
    if request.cross_fitted:
        return ()
    said = (
        "one search batch: the layers were ranked and the sizes chosen on the same tokens, so the search score "
        "flatters the plan (two or more search batches keep them apart)"
    )
    return (Note(NoteKind.ONE_SEARCH_BATCH, said),)


def _bound_note(request: FormatRequest, chosen: CurvePoint) -> tuple[Note, ...]:
    """How the search held the target: at the score's bound, what the search tokens' own spread allows."""
    target = request.goal.target
    if request.goal.confidence is None or math.isnan(chosen.bound) or target is None:
        return ()
    if not target.met(chosen.bound):
        said = (
            f"{target} does not hold at the {request.goal.confidence:.0%} bound of the score over the search tokens "
            f"({chosen.bound:.4g}; the score itself {chosen.score:.4g})"
        )
        return (Note(NoteKind.MISSED_AT_BOUND, said),)
    said = (
        f"the search held {request.goal.target} at the {request.goal.confidence:.0%} bound of the score over its "
        f"tokens ({chosen.bound:.4g}; the score itself {chosen.score:.4g}): the margin is what the search text's "
        "own spread says other text may lose"
    )
    return (Note(NoteKind.AT_BOUND, said),)


def _measured_notes(measure: _Measure, chosen: CurvePoint) -> tuple[Note, ...]:
    """What the scores are relative to, and where torchao stores more than the mean bits count."""
    notes = []
    if not math.isnan(measure.search.float_perplexity):
        said = (
            f"the float model's perplexity: {measure.search.float_perplexity:.4g} on the search tokens (the scores "
            "are ratios to it)"
        )
        notes.append(Note(NoteKind.FLOAT_PERPLEXITY, said))
    parameters = sum(layer.parameters for layer in measure.layers)
    stored = 8 * chosen.state_bytes / parameters
    if stored > chosen.mean_bits + 0.5:
        said = (
            f"stored as torchao lays the weights out here: {stored:.2f} bits per weight against "
            f"{chosen.mean_bits:.2f} counted (its int4 weights on CPU, IntxUnpackedToInt8Tensor, hold one value per "
            "byte; packed int4 kernels store 4 bits)"
        )
        notes.append(Note(NoteKind.STORED_BITS, said))
    return tuple(notes)


def _held_out_note(request: FormatRequest, measure: _Measure, chosen: CurvePoint) -> tuple[Note, ...]:
    if measure.held is None:
        return (
            Note(
                NoteKind.NO_HELD_OUT,
                "no held-out data (one evaluation batch): the plan's score is the one it was chosen on",
            ),
        )
    if request.goal.target is None:
        return ()
    return held_out_miss(request.goal.target, "search", measure.met(chosen), chosen.score, chosen.held_out)


def _proxy_orders(measure: _Measure) -> dict[str, Sequence[Move]]:
    """The moves ranked by the Fisher proxy and by the activation-weighted weight error (:mod:`.proxies`)."""
    model, layers, search = measure.model, measure.layers, measure.request.rank
    errors = proxies.weight_errors(model, layers)
    damages = {
        "fisher (sum of g^2 dW^2)": proxies.fisher_damage(model, layers, search, errors),
        "activation (sum of E[x^2] dW^2)": proxies.activation_damage(
            errors, proxies.input_power(model, layers, search)
        ),
    }
    return {name: ladders.ordered_moves(layers, damage) for name, damage in damages.items()}


def _orders(
    measure: _Measure,
    orders: Mapping[str, Sequence[Move]],
    searched: Mapping[str, tuple[int, tuple[Note, ...]]],
    order: str,
    chosen: CurvePoint,
) -> tuple[OrderCheck, ...]:
    """Each ranking at the plan's bits, quantized for real on both parts (``order``'s is the plan), and at
    the size its own search chose."""
    layers = measure.layers
    found = []
    for name, moves in orders.items():
        at_plan_bits = ladders.assignment(layers, moves, ladders.within(layers, moves, chosen.mean_bits))
        point = chosen if name == order else measure.point(name, at_plan_bits, held_out=True)
        own = measure.point(name, ladders.assignment(layers, moves, searched[name][0]))
        found.append(OrderCheck(order=name, point=point, searched=own))
    return tuple(found)


__all__ = ["FormatGoal", "FormatRequest", "format_goal", "format_request", "plan_formats"]
