"""The last stage of a plan: its config quantized for real (prepare, calibrate, convert) and scored.

Where the real score misses a target the simulation reached, the config is quantized again without
the parts the search could not see (equalization, per-tensor weights: measured on the default config,
not this one); if it still misses, the longest prefix of the sites the search quantized that reaches
it for real is found by bisection, each probe one real quantization. A plan scoring below the flow's
default config is replaced by the default, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from qinsight.core.metrics import MetricSpec
from qinsight.core.notes import Note, NoteKind
from qinsight.core.outcomes import FailedConfig, Outcome, measured
from qinsight.core.plan import Budget, SuggestionCheck, Target
from qinsight.core.suggestions import QuantSuggestion
from qinsight.core.verification import suggestion_kinds
from qinsight.planning.checks import RealScore, mode_of, split_for_real
from qinsight.planning.search import final_score, taken
from qinsight.planning.simulated_flows import mode_suggestions
from qinsight.planning.stages import Checked, Searched
from qinsight.planning.switches import Mode


@attrs.frozen
class Verified:
    """The plan's config as verified: its ``suggestions``, the sites' final ``modes``, the checks (a
    part dropped for real says why), its real ``score``; ``default`` when the flow's default config
    scored better and replaced it."""

    suggestions: tuple[QuantSuggestion, ...]
    modes: dict[str, Mode]
    checks: tuple[SuggestionCheck, ...]
    score: float
    notes: tuple[Note, ...]
    default: bool = False


def verified(
    real: RealScore,
    goal: Target | Budget,
    spec: MetricSpec,
    found: Checked,
    search: Searched,
    default_score: float,
    probe: RealScore | None = None,
) -> Verified:
    """The searched config (``found``'s kept suggestions, ``search``'s modes) quantized for real (``real``:
    :meth:`PlanRun.real_score`), the unseen parts checked, bisected where it misses ``goal``; the default
    config where that scored better (in ``spec``'s direction) or the flow could not build or run it.
    ``probe``: a cheaper real score the bisection searches with first (the reference model, where ``real``
    scores the lowered program), ``real`` confirming where it ends."""
    kept, checks, score, notes = _unseen_parts_checked(real, goal, found.kept, found.checks, search, spec)
    modes, score, more = bisected(real, goal, kept, found.start, search, score, probe)
    notes += more
    if isinstance(score, FailedConfig) or spec.worse(score, default_score):
        said = (
            f"the flow cannot build or run the plan's config ({score.error})"
            if isinstance(score, FailedConfig)
            else f"the plan ({score:.4g}) scored below the default config ({default_score:.4g})"
        )
        notes.append(Note(NoteKind.DEFAULT_RETURNED, f"{said}: the default is returned"))
        return Verified((), {site: Mode.STATIC for site in modes}, checks, default_score, tuple(notes), default=True)
    return Verified(advice(kept, modes), modes, checks, score, tuple(notes))


def bisected(
    real_score: RealScore,
    goal: Target | Budget,
    kept: tuple[QuantSuggestion, ...],
    start: dict[str, Mode],
    search: Searched,
    as_searched: Outcome,
    probe_score: RealScore | None = None,
) -> tuple[dict[str, Mode], Outcome, list[Note]]:
    """The plan's config as quantized for real scored ``as_searched``. Where it misses a target the
    simulation reached, the longest prefix of the quantized sites (in the order they were taken)
    that reaches it for real is found by bisection: each probe is one real quantization. With a
    ``probe_score`` (the reference, where ``real_score`` lowers), the bisection runs on it and the real
    score takes over at its end: from there, up while the real score still meets the target, else down."""
    modes, steps = search.modes, search.steps
    if isinstance(goal, Budget) or _met(goal, as_searched) or not goal.met(final_score(steps)):
        return modes, as_searched, []
    path = [(step.fqn, Mode(step.mode) if step.mode else start[step.fqn]) for step in steps if step.fqn and step.kept]
    floats = {site: Mode.FLOAT for site, _ in path}

    def prefix(n: int) -> dict[str, Mode]:
        return taken({**modes, **floats}, path[:n])

    def bisect(score: RealScore, low: int, high: int) -> tuple[int, Outcome | None]:
        """prefix(low) is assumed to reach the target, prefix(high) does not: the last that does."""
        best: Outcome | None = None
        while high - low > 1:
            middle = (low + high) // 2
            found = score(advice(kept, prefix(middle)))
            low, high, best = (middle, high, found) if _met(goal, found) else (low, middle, best)
        return low, best

    if probe_score is None:
        low, best = bisect(real_score, 0, len(path))
    else:
        low, _ = bisect(probe_score, 0, len(path))
        at = real_score(advice(kept, prefix(low)))
        if not _met(goal, at):
            low, best = bisect(real_score, 0, low)
        else:  # the next step usually misses for real too: one probe, a bisection above it only where not
            after = real_score(advice(kept, prefix(low + 1))) if low + 1 < len(path) else None
            if after is not None and _met(goal, after):
                low, best = bisect(real_score, low + 1, len(path))
                best = best if best is not None else after
            else:
                best = at
    if best is None:
        best = real_score(advice(kept, prefix(low)))
    said = f"{as_searched:.6g}" if not isinstance(as_searched, FailedConfig) else "a config it cannot build or run"
    note = Note(
        NoteKind.BISECTED,
        f"the real flow scored {said} where the simulation reached the target: "
        f"{len(path) - low} of the {len(path)} steps the search took are undone after bisecting for real",
    )
    return prefix(low), best, [note]


def _met(goal: Target, outcome: Outcome) -> bool:
    """Whether ``outcome`` meets ``goal``: a config the flow could not build or run meets none."""
    return not isinstance(outcome, FailedConfig) and goal.met(outcome)


def _unseen_parts_checked(
    real_score: RealScore,
    goal: Target | Budget,
    kept: tuple[QuantSuggestion, ...],
    checks: tuple[SuggestionCheck, ...],
    search: Searched,
    spec: MetricSpec,
) -> tuple[tuple[QuantSuggestion, ...], tuple[SuggestionCheck, ...], Outcome, list[Note]]:
    """The plan's config quantized for real, with the kept parts the search cannot see (equalization,
    per-tensor weights: they were measured on the default config, not on this one). Where that
    misses a target the simulation reached, the config as searched is quantized too, and where it
    scores better those parts are dropped, their checks saying why."""
    score = real_score(advice(kept, search.modes))
    as_searched, unseen = split_for_real(kept)
    if not unseen or isinstance(goal, Budget) or _met(goal, score) or not goal.met(final_score(search.steps)):
        return kept, checks, score, []
    searched = tuple(as_searched)  # one part per kept suggestion, as ``kept`` has one per site
    without = real_score(advice(searched, search.modes))
    if not spec.worse(score, without):
        return kept, checks, score, []
    said = ", ".join(part.describe() + " at " + part.fqn for part in unseen)
    with_them = f"{score:.4g}" if not isinstance(score, FailedConfig) else f"nothing (the flow failed: {score.error})"
    without_them = f"{measured(without):.4g}"
    reason = f"not applied: the planned config scored {with_them} with it, {without_them} without, measured for real"
    dropped = {(part.fqn, suggestion_kinds(part)) for part in unseen}
    checks = tuple(
        attrs.evolve(check, kept=False, reason=reason, why=NoteKind.UNSEEN_DROPPED)
        if check.kept and (check.fqn, check.kinds) in dropped
        else check
        for check in checks
    )
    dropped_note = Note(
        NoteKind.UNSEEN_DROPPED,
        f"{said}: dropped, the planned config scored {with_them} with them, {without_them} without",
    )
    return searched, checks, without, [dropped_note]


def advice(kept: tuple[QuantSuggestion, ...], modes: Mapping[str, Mode]) -> tuple[QuantSuggestion, ...]:
    """The kept suggestions, and the plan's own for each site it runs otherwise than they say
    (kept in float, or a Linear made dynamic)."""
    said = {s.fqn: mode_of(s) for s in kept}
    moved = {
        site: mode
        for site, mode in modes.items()
        if mode is not Mode.STATIC and said.get(site, Mode.STATIC) is not mode
    }
    return tuple(s for s in kept if s.fqn not in moved) + mode_suggestions(moved)


__all__ = ["Verified", "advice", "bisected", "verified"]
