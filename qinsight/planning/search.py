"""How a plan chooses what to quantize: the quality-vs-fraction-quantized curve and its refinement.

Every step takes one site down from float (a Linear that adds less noise
dynamic than static: to dynamic first, to static later), in order of the
noise it adds alone per weight parameter it quantizes: the output's (for
top-1, the margins' too: a search in each order, the better kept). Each
prefix of the steps is scored in the simulation; the longest prefix that
meets the target is kept and each later step tried alone on top of it. The
budget form (``float<=N``) keeps in float the N sites costliest alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from qinsight.core.metrics import MetricSpec
from qinsight.core.notes import Note, NoteKind
from qinsight.core.plan import Budget, PlanStep, SearchedOrder, Target
from qinsight.core.progress import Progress
from qinsight.planning.scores import Scorer, Verdict
from qinsight.planning.simulate import Simulation
from qinsight.planning.sweep import Move, greedy, sweep
from qinsight.planning.switches import Mode

# Refinement passes over the steps still not taken: a step refused at one point can fit once others
# are in (a coarse metric like top-1 on a few dozen samples is not monotone). Passes stop early when
# one takes nothing; the bound keeps the worst case linear in the steps.
REFINE_PASSES = 3


@attrs.define
class Search:
    """The simulation's side of a plan (its :class:`~qinsight.planning.plan_run.PlanRun` owns it): the
    calibrated simulation, the scorer, the candidate sites with their kinds and weight counts."""

    sim: Simulation
    scorer: Scorer
    batches: list[Any]  # the evaluation batches the scorer's reference is of
    candidates: list[str]
    parameters: dict[str, int]
    kinds: dict[str, str]
    progress: Progress
    fixed: dict[str, Mode]  # sites in the config that are not searched
    spec: MetricSpec  # the plan's metric: the direction its scores are compared in (PlanRequest.spec)

    def everything_float(self) -> dict[str, Mode]:
        """Every candidate in float; the fixed sites as they are fixed."""
        return {**{site: Mode.FLOAT for site in self.candidates}, **self.fixed}

    def fraction(self, modes: Mapping[str, Mode]) -> float:
        total = sum(self.parameters.values())
        if total == 0:
            return 1.0
        return sum(n for site, n in self.parameters.items() if modes.get(site, Mode.STATIC) is not Mode.FLOAT) / total


Noise = dict[str, dict[str, float]]  # per order (Scorer.orders), per site: its noise quantized alone


def measure_dynamic_noise(search: Search, start: dict[str, Mode], noise: Noise) -> Noise:
    """For each Linear that starts static, the noise with it alone quantized dynamically, per order,
    where that is less than static: those get a step to dynamic (weights int8, the input per batch)
    before the step to static. One partial run each, from the all-float run."""
    everything_float = search.everything_float()
    found: Noise = {order: {} for order in noise}
    linears = [site for site in search.candidates if search.kinds.get(site) == "linear" and start[site] is Mode.STATIC]

    def measuring(done: int, total: int) -> None:
        search.progress("measuring dynamic Linears", done, total)

    each = [{**everything_float, site: Mode.DYNAMIC} for site in linears]
    noises = sweep(search.sim, everything_float, each, search.batches, search.scorer.noise, progress=measuring)[1]
    for site, by_order in zip(linears, noises):
        for order, dynamic in by_order.items():
            if dynamic < noise[order][site]:
                found[order][site] = dynamic
    return found


def choose_order(
    search: Search, goal: Target | Budget, start: dict[str, Mode], noise: Noise, dynamic_noise: Noise
) -> tuple[tuple[PlanStep, ...], dict[str, Mode], tuple[SearchedOrder, ...]]:
    """:func:`choose` in each order the noise was measured in. With several (top-1: the output's
    noise and the margins'), neither is better everywhere (MobileNetV2 at 30/32: PT2E kept 73% of
    the conv weights int8 by the output's, 90% by the margins'; FX 78% and 63%), so both run and
    the one that meets the target with the most weights quantized (then the better score) is kept.
    Returns its steps and modes, and what each order reached (none where there was one)."""
    found: list[tuple[tuple[PlanStep, ...], dict[str, Mode], SearchedOrder]] = []
    for order, by_site in noise.items():
        steps, modes = choose(search, goal, start, by_site, dynamic_noise[order])
        budget = isinstance(goal, Budget)
        score = search.spec.best(step.score for step in steps) if budget else final_score(steps)
        met = isinstance(goal, Budget) or goal.met(score)
        reached = SearchedOrder(
            order=order, quantized_fraction=search.fraction(modes), score=score, met=met, taken=False
        )
        found.append((steps, modes, reached))
    sign = 1.0 if search.spec.higher_is_better else -1.0
    # ranked by whether it meets the target, then the share of the weights quantized, then the score; the
    # first of equals: the output's noise
    steps, modes, best = max(found, key=lambda f: (f[2].met, f[2].quantized_fraction, sign * f[2].score))
    if len(found) == 1:
        return steps, modes, ()
    return steps, modes, tuple(attrs.evolve(reached, taken=reached is best) for _, _, reached in found)


def order_notes(orders: Sequence[SearchedOrder]) -> tuple[Note, ...]:
    """Which of several orders the search took, and what each reached, for people."""
    if not orders:
        return ()
    taken = next(o.order for o in orders if o.taken)
    said = "; ".join(
        f"by {o.order}, {o.quantized_fraction:.1%} of the weights quantized at {o.score:.4g}" for o in orders
    )
    return (
        Note(NoteKind.SEARCH_ORDER, f"sites taken in order of {taken}, of {len(orders)} searches ({said}, simulated)"),
    )


def final_score(steps: Sequence[PlanStep]) -> float:
    """The score of the config a search ends with: its last kept step's."""
    kept = [step.score for step in steps if step.kept]
    return kept[-1] if kept else math.nan


def steps_down(
    search: Search, start: dict[str, Mode], noise: Mapping[str, float], dynamic_noise: Mapping[str, float]
) -> list[Move]:
    """Every step down from float, in order of the output noise it adds (measured alone) per weight
    parameter it quantizes: a Linear with a dynamic step takes it first (all its weights), then the
    step to static (no more weights: ordered by its extra noise, after the weight-bearing steps)."""
    keyed: list[tuple[float, int, Move]] = []
    for site in search.candidates:
        if start[site] is Mode.FLOAT:
            continue
        weights = search.parameters[site] + 1
        if site in dynamic_noise:
            first = dynamic_noise[site] / weights
            keyed.append((first, len(keyed), (site, Mode.DYNAMIC)))
            keyed.append((max(first, noise[site] - dynamic_noise[site]), len(keyed), (site, Mode.STATIC)))
        else:
            keyed.append((noise[site] / weights, len(keyed), (site, start[site])))
    return [move for _, _, move in sorted(keyed)]


def choose(
    search: Search,
    goal: Target | Budget,
    start: dict[str, Mode],
    noise: Mapping[str, float],
    dynamic_noise: Mapping[str, float],
) -> tuple[tuple[PlanStep, ...], dict[str, Mode]]:
    """The curve, then the refinement: the steps of :func:`steps_down` are taken one by one from all in
    float, each prefix scored; the longest prefix that meets the target is kept, and each step after
    it is tried alone on top and kept if the target still holds, in passes until one takes none."""
    if isinstance(goal, Budget):
        return within_budget(search, goal.sites, start, noise)
    moves = steps_down(search, start, noise, dynamic_noise)
    everything_float = search.everything_float()
    prefixes = [taken(everything_float, moves[: n + 1]) for n in range(len(moves))]

    def scoring(done: int, total: int) -> None:
        search.progress("scoring the curve", done, total)

    first, scores = sweep(
        search.sim, everything_float, prefixes, search.batches, search.scorer, chained=True, progress=scoring
    )
    curve = [
        _step(search, site, mode, score, modes, "curve") for (site, mode), score, modes in zip(moves, scores, prefixes)
    ]
    met = [index for index, step in enumerate(curve) if goal.met(step.score)]
    longest = met[-1] + 1 if met else 0
    steps = [_start(search, everything_float, first)]
    steps += [attrs.evolve(step, kept=index < longest) for index, step in enumerate(curve)]
    modes = taken(everything_float, moves[:longest])
    pending = moves[longest:]
    for _ in range(REFINE_PASSES):
        modes, rejected, tried = _refined(search, goal, modes, pending, dynamic_noise)
        steps += tried
        if len(rejected) == len(pending):
            break
        pending = rejected
    return tuple(steps), modes


def _refined(
    search: Search, goal: Target, modes: dict[str, Mode], pending: Sequence[Move], dynamic_noise: Mapping[str, float]
) -> tuple[dict[str, Mode], list[Move], list[PlanStep]]:
    """One refinement pass: each pending step tried alone on top of ``modes`` in order, kept where the
    target still holds (:func:`~qinsight.planning.sweep.greedy`). Returns the modes, the steps not taken
    and the steps tried."""

    def applies(current: Mapping[str, Mode], move: Move) -> bool:  # a Linear's step to static waits for its dynamic one
        site, mode = move
        return not (mode is Mode.STATIC and site in dynamic_noise and current[site] is not Mode.DYNAMIC)

    def refining(done: int, total: int) -> None:
        search.progress("refining", done, total)

    sim, batches, scorer = search.sim, search.batches, search.scorer

    def verdict(outputs: list[Any]) -> Verdict:  # a miss certain on the first batches says so
        return scorer.verdict(outputs, goal.met)

    def settled(outputs: list[Any]) -> Verdict | None:  # ... and stops running there
        return scorer.settled(outputs, goal.met)

    def accept(found: Verdict) -> bool:
        return goal.met(found[0])

    final, tried = greedy(sim, modes, pending, batches, verdict, accept, applies, refining, settled)
    steps = []
    for step in tried:  # replayed: each step's fraction is of the modes it left
        if step.score is None:
            continue
        (site, mode), kept, (score, settled_after) = step.move, step.kept, step.score
        modes = {**modes, site: mode} if kept else modes
        found = _step(search, site, mode, score, modes, "refine")
        steps.append(attrs.evolve(found, kept=kept, settled_after=settled_after))
    return final, [step.move for step in tried if not step.kept], steps


def _start(search: Search, modes: Mapping[str, Mode], score: float) -> PlanStep:
    """The step every search starts from: ``modes`` scored ``score``, no site taken yet."""
    return PlanStep(fqn="", score=score, kept=True, quantized_fraction=search.fraction(modes), stage="start")


def _step(search: Search, site: str, mode: Mode, score: float, modes: Mapping[str, Mode], stage: str) -> PlanStep:
    return PlanStep(
        fqn=site, score=score, kept=True, quantized_fraction=search.fraction(modes), stage=stage, mode=mode.value
    )


def taken(modes: Mapping[str, Mode], moves: Iterable[Move]) -> dict[str, Mode]:
    """``modes`` after ``moves``, in order (a Linear's static step overrides its dynamic one)."""
    result = dict(modes)
    for site, mode in moves:
        result[site] = mode
    return result


def within_budget(
    search: Search, budget: int, start: dict[str, Mode], noise: Mapping[str, float]
) -> tuple[tuple[PlanStep, ...], dict[str, Mode]]:
    """At most ``budget`` sites in float: the costliest alone, one by one, and the best prefix."""
    floated = sorted((s for s in search.candidates if start[s] is not Mode.FLOAT), key=lambda s: -noise[s])[:budget]
    prefixes = [{**start, **{site: Mode.FLOAT for site in floated[: n + 1]}} for n in range(len(floated))]
    first, scores = sweep(search.sim, start, prefixes, search.batches, search.scorer, chained=True)
    steps = [_start(search, start, first)]
    best, best_modes = first, dict(start)
    for site, score, modes in zip(floated, scores, prefixes):
        steps.append(
            PlanStep(fqn=site, score=score, kept=True, quantized_fraction=search.fraction(modes), stage="budget")
        )
        if search.spec.worse(best, score):
            best, best_modes = score, dict(modes)
    return tuple(steps), best_modes


__all__ = [
    "Move",
    "Noise",
    "Progress",
    "Search",
    "choose",
    "choose_order",
    "order_notes",
    "final_score",
    "measure_dynamic_noise",
    "steps_down",
    "taken",
    "within_budget",
]
