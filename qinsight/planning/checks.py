"""The report's suggestions, each applied alone on the flow's default config, and among the others.
A suggestion that lowers the score among the others is dropped, with the measured effect as the
reason. Keep-float and activation modes are applied in the simulation; what the simulation cannot
express (input-weight equalization, per-tensor weights) through the real flow, one prepare /
calibrate / convert each. A suggestion saying both is checked as its two parts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import attrs

from qinsight.core.flows import FlowSpec
from qinsight.core.notes import Note, NoteKind
from qinsight.core.outcomes import FailedConfig, Outcome, measured
from qinsight.core.plan import SuggestionCheck
from qinsight.core.sites import WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion, merge_suggestions
from qinsight.planning.search import Search
from qinsight.planning.sweep import sweep
from qinsight.planning.switches import Mode

RealScore = Callable[[tuple[QuantSuggestion, ...]], Outcome]  # a config quantized by the flow: scored, or failed


@attrs.frozen
class Measuring:
    """How a suggestion is measured: in the ``search``'s simulation, on its batches, by its scorer (scores
    compare in its metric's direction); or for real (``real``), where the simulation cannot express it."""

    search: Search
    real: RealScore


def is_default(suggestion: QuantSuggestion) -> bool:
    """Static activations and per-channel weights: what both x86 flows do unless told otherwise."""
    return (
        not suggestion.keep_float
        and not suggestion.equalize
        and suggestion.activation in (None, ActivationMode.STATIC)
        and suggestion.weight in (None, WeightScheme.PER_CHANNEL)
    )


def split_for_real(suggestions: Sequence[QuantSuggestion]) -> tuple[list[QuantSuggestion], list[QuantSuggestion]]:
    """Each suggestion as the part the simulation applies (keep-float, activation mode, per-channel
    weights) and the parts only the real flow can (an equalization, per-tensor weights), each a
    suggestion of its own; parts that say nothing are left out."""
    simulated, real = [], []
    for s in suggestions:
        per_tensor = s.weight is WeightScheme.PER_TENSOR and not s.keep_float
        rest = attrs.evolve(s, equalize=None, weight=None if per_tensor else s.weight)
        if not rest.changes_nothing:
            simulated.append(rest)
        if s.equalize and not s.keep_float:
            real.append(QuantSuggestion(fqn=s.fqn, equalize=True, sources=s.sources))
        if per_tensor:
            real.append(QuantSuggestion(fqn=s.fqn, weight=WeightScheme.PER_TENSOR, sources=s.sources))
    return simulated, real


def mode_of(suggestion: QuantSuggestion) -> Mode:
    """The simulated mode that applies a suggestion's keep-float and activation choice."""
    if suggestion.keep_float:
        return Mode.FLOAT
    return Mode.DYNAMIC if suggestion.activation is ActivationMode.DYNAMIC else Mode.STATIC


def check_simulated(
    measuring: Measuring, suggestions: Sequence[QuantSuggestion], default: Mapping[str, Mode]
) -> tuple[tuple[SuggestionCheck, ...], dict[str, Mode]]:
    """Every suggestion checked in the simulation; the modes the search starts from (the default
    with the kept ones)."""
    search = measuring.search
    sim, score, evaluation = search.sim, search.scorer, search.batches
    measurable = {s.fqn: mode_of(s) for s in suggestions if not is_default(s) and s.fqn in default}
    together_modes = {**default, **measurable}
    each_alone = [{**default, fqn: mode} for fqn, mode in measurable.items()]
    before, scores = sweep(sim, default, [*each_alone, together_modes], evaluation, score)
    alone, together = dict(zip(measurable, scores)), scores[-1]
    each_left_out = [{**together_modes, fqn: default[fqn]} for fqn in measurable]
    without = dict(zip(measurable, sweep(sim, together_modes, each_left_out, evaluation, score)[1]))

    checks: list[SuggestionCheck] = []
    start = dict(default)
    for suggestion in suggestions:
        fqn = suggestion.fqn
        if fqn in measurable:
            kept = not search.spec.worse(together, without[fqn])
            check = SuggestionCheck.of(
                suggestion,
                before=before,
                alone=alone[fqn],
                together=together,
                without=without[fqn],
                kept=kept,
                reason=""
                if kept
                else f"not applied: {together - without[fqn]:+.3g} on the output among the other suggestions",
                why=None if kept else NoteKind.HURTS,
            )
            if kept:
                start[fqn] = measurable[fqn]
        elif is_default(suggestion):
            check = SuggestionCheck.of(
                suggestion,
                before=before,
                alone=before,
                kept=True,
                reason="what the flow's default config does already",
                why=NoteKind.ALREADY_DEFAULT,
            )
        else:
            check = SuggestionCheck.of(
                suggestion,
                before=before,
                alone=math.nan,
                kept=True,
                reason="not measured: the flow's default config does not quantize this site; applied as suggested",
                why=NoteKind.NOT_MEASURED,
            )
        checks.append(check)
    return tuple(checks), start


def check_real(
    measuring: Measuring, others: Sequence[QuantSuggestion], parts: Sequence[QuantSuggestion], before: float
) -> list[SuggestionCheck]:
    """Each part quantized for real: alone on the default config, and with the ``others`` (the kept
    suggestions) and the other parts, with and without it."""
    if not parts:
        return []
    real = measuring.real
    together_config = (*others, *parts)
    together = real(together_config)
    checks = []
    for part in parts:
        without = real(tuple(s for s in together_config if s is not part))
        kept = not measuring.search.spec.worse(together, without)
        reason = (
            Note(NoteKind.MEASURED_REAL, "measured for real (prepare, calibrate, convert)")
            if kept
            else Note(
                NoteKind.FLOW_CANNOT_RUN,
                f"not applied: with it the flow cannot build or run the config: {together.error}",
            )
            if isinstance(together, FailedConfig)
            else Note(
                NoteKind.HURTS,
                f"not applied: {together - measured(without):+.3g} on the output among the other suggestions, "
                "measured for real",
            )
        )
        checks.append(
            SuggestionCheck.of(
                part,
                before=before,
                alone=measured(real((part,))),
                together=measured(together),
                without=measured(without),
                kept=kept,
                reason=reason.text,
                why=reason.kind,
            )
        )
    return checks


def check_all(
    measuring: Measuring,
    suggestions: Sequence[QuantSuggestion],
    default: Mapping[str, Mode],
    flow: FlowSpec,
    default_score: float,
) -> tuple[tuple[SuggestionCheck, ...], dict[str, Mode], tuple[QuantSuggestion, ...]]:
    """Every suggestion checked, in the simulation or for real (``default_score`` is the default
    config's real score; an equalization in a ``flow`` that has none is not applied, and says so).
    Returns the checks, the modes the search starts from and the kept suggestions (a suggestion's
    kept parts merged again)."""
    simulated, for_real = split_for_real(suggestions)
    checks, start = check_simulated(measuring, simulated, default)
    kept = [s for s, check in zip(simulated, checks) if check.kept]
    measurable = [p for p in for_real if flow.equalizes or not p.equalize]
    real_checks = check_real(measuring, kept, measurable, default_score)
    kept += [p for p, check in zip(measurable, real_checks) if check.kept]
    refused = [
        SuggestionCheck.of(
            p,
            before=default_score,
            alone=math.nan,
            kept=False,
            reason=f"not applied: the {flow.name} flow has no input-weight equalization",
            why=NoteKind.UNEQUALIZED,
        )
        for p in for_real
        if p not in measurable
    ]
    merged, _conflicts = merge_suggestions(kept)  # the parts of one suggestion never conflict
    return checks + tuple(real_checks) + tuple(refused), start, merged


__all__ = [
    "Measuring",
    "RealScore",
    "check_all",
    "check_real",
    "check_simulated",
    "is_default",
    "mode_of",
    "split_for_real",
]
