"""The report's suggestions, each applied alone on the flow's default config, and among the others.
A suggestion that lowers the score among the others is dropped, with the measured effect as the
reason. Keep-float and activation modes are applied in the simulation; input-weight equalization,
which the simulation cannot express, through the real flow (FX: prepare_fx's own equalization);
one that cannot be applied either way is kept and marked not measured."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import attrs

from qinsight.core.plan import SuggestionCheck
from qinsight.core.sites import WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion, merge_suggestions
from qinsight.planning.simulate import Mode, Run, Simulation

Score = Callable[[Run], float]


def is_default(suggestion: QuantSuggestion) -> bool:
    """Static activations and per-channel weights: what both x86 flows do unless told otherwise."""
    return (
        not suggestion.keep_float
        and not suggestion.equalize
        and suggestion.activation in (None, ActivationMode.STATIC)
        and suggestion.weight in (None, WeightScheme.PER_CHANNEL)
    )


def split_equalization(suggestions: Sequence[QuantSuggestion]) -> tuple[list[QuantSuggestion], list[QuantSuggestion]]:
    """Each suggestion's equalization apart from the rest, as they are measured apart: the rest
    (those that still say something) and the equalizations."""
    rest = [attrs.evolve(s, equalize=None) for s in suggestions]
    equalize = [QuantSuggestion(fqn=s.fqn, equalize=True, sources=s.sources) for s in suggestions if s.equalize]
    return [s for s in rest if s.describe() != "no change"], equalize


def mode_of(suggestion: QuantSuggestion) -> Mode | None:
    """The simulated mode that applies a suggestion's keep-float and activation choice, ``None``
    where the simulation cannot apply it (a per-tensor weight scheme)."""
    if suggestion.keep_float:
        return Mode.FLOAT
    if suggestion.weight is WeightScheme.PER_TENSOR:
        return None
    return Mode.DYNAMIC if suggestion.activation is ActivationMode.DYNAMIC else Mode.STATIC


def check_suggestions(
    sim: Simulation,
    score: Score,
    suggestions: Sequence[QuantSuggestion],
    default: Mapping[str, Mode],
    evaluation: Sequence[object],
    higher_is_better: bool,
) -> tuple[tuple[SuggestionCheck, ...], dict[str, Mode]]:
    """Every suggestion checked; the modes the search starts from (the default with the kept ones)."""
    base = sim.run(default, evaluation)
    before = score(base)
    measurable = {
        s.fqn: mode for s in suggestions if not is_default(s) and s.fqn in default and (mode := mode_of(s)) is not None
    }
    alone = {fqn: score(sim.run_changed({**default, fqn: mode}, base)) for fqn, mode in measurable.items()}
    together_modes = {**default, **measurable}
    together_run = sim.run_changed(together_modes, base)
    together = score(together_run)
    without = {fqn: score(sim.run_changed({**together_modes, fqn: default[fqn]}, together_run)) for fqn in measurable}

    def worse(a: float, b: float) -> bool:
        return a < b if higher_is_better else a > b

    checks: list[SuggestionCheck] = []
    start = dict(default)
    for suggestion in suggestions:
        fqn, change = suggestion.fqn, suggestion.describe()
        if fqn in measurable:
            kept = not worse(together, without[fqn])
            reason = "" if kept else f"not applied: {together - without[fqn]:+.3g} on the output among the other suggestions"
            check = SuggestionCheck(
                fqn=fqn, change=change, before=before, alone=alone[fqn], together=together, without=without[fqn],
                kept=kept, reason=reason,
            )
            if kept:
                start[fqn] = measurable[fqn]
        elif is_default(suggestion):
            check = SuggestionCheck(fqn=fqn, change=change, before=before, alone=before, kept=True,
                                    reason="what the flow's default config does already")
        else:
            reason = (
                "not measured: the flow's default config does not quantize this site" if fqn not in default
                else "not measured: the simulation has no per-tensor weights"
            )
            check = SuggestionCheck(fqn=fqn, change=change, before=before, alone=math.nan, kept=True,
                                    reason=reason + "; applied as suggested")
        checks.append(check)
    return tuple(checks), start


def check_equalizations(
    real: Callable[[tuple[QuantSuggestion, ...]], float],
    others: Sequence[QuantSuggestion],
    equalizations: Sequence[QuantSuggestion],
    before: float,
    higher_is_better: bool,
) -> list[SuggestionCheck]:
    """Each equalization quantized for real (``real`` scores a config): alone on the default config,
    and with the ``others`` (the kept suggestions) and the other equalizations, with and without it."""
    if not equalizations:
        return []
    together_config = (*others, *equalizations)
    together = real(together_config)
    checks = []
    for suggestion in equalizations:
        alone = real((suggestion,))
        without = real(tuple(s for s in together_config if s is not suggestion))
        kept = (together >= without) if higher_is_better else (together <= without)
        checks.append(SuggestionCheck(
            fqn=suggestion.fqn, change=suggestion.describe(), before=before, alone=alone, together=together,
            without=without, kept=kept,
            reason="measured for real (prepare_fx with its equalization)" if kept
            else f"not applied: {together - without:+.3g} on the output among the other suggestions, measured for real",
        ))
    return checks


def unmeasured_equalizations(equalizations: Sequence[QuantSuggestion], flow: str, before: float) -> list[SuggestionCheck]:
    """The equalizations of a flow that has none (PT2E): not applied, and said so."""
    return [
        SuggestionCheck(fqn=s.fqn, change=s.describe(), before=before, alone=math.nan, kept=False,
                        reason=f"not applied: the {flow} flow has no input-weight equalization")
        for s in equalizations
    ]


def check_all(
    sim: Simulation,
    score: Score,
    real: Callable[[tuple[QuantSuggestion, ...]], float] | None,
    suggestions: Sequence[QuantSuggestion],
    default: Mapping[str, Mode],
    evaluation: Sequence[object],
    higher_is_better: bool,
    flow: str,
    default_score: float,
) -> tuple[tuple[SuggestionCheck, ...], dict[str, Mode], tuple[QuantSuggestion, ...]]:
    """Every suggestion checked: modes in the simulation, equalizations for real (``real`` scores a
    config quantized by the flow; ``None``: the flow has no equalization). Returns the checks, the
    modes the search starts from and the kept suggestions (a suggestion's parts merged again)."""
    modes_said, equalizations = split_equalization(suggestions)
    checks, start = check_suggestions(sim, score, modes_said, default, evaluation, higher_is_better)
    kept_modes = [s for s, check in zip(modes_said, checks) if check.kept]
    equalization_checks = (
        check_equalizations(real, kept_modes, equalizations, default_score, higher_is_better) if real is not None
        else unmeasured_equalizations(equalizations, flow, default_score)
    )
    kept_equalizations = [s for s, check in zip(equalizations, equalization_checks) if check.kept]
    kept, _conflicts = merge_suggestions([*kept_modes, *kept_equalizations])  # parts of one suggestion never conflict
    return checks + tuple(equalization_checks), start, kept


__all__ = ["check_all", "check_equalizations", "check_suggestions", "is_default", "mode_of", "split_equalization", "unmeasured_equalizations"]
