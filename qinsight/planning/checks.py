"""The report's suggestions, each applied in the simulation: alone on the flow's default config, and
among the others. A suggestion that lowers the score among the others is dropped, with the
measured effect as the reason; one the simulation cannot apply is kept and marked not measured."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from qinsight.core.plan import SuggestionCheck
from qinsight.core.sites import WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion
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


def mode_of(suggestion: QuantSuggestion) -> Mode | None:
    """The simulated mode that applies a suggestion, ``None`` where the simulation cannot apply it
    (input-weight equalization, a per-tensor weight scheme)."""
    if suggestion.keep_float:
        return Mode.FLOAT
    if suggestion.equalize or suggestion.weight is WeightScheme.PER_TENSOR:
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
    measurable = {s.fqn: mode for s in suggestions if not is_default(s) and s.fqn in default and (mode := mode_of(s)) is not None}
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
                else "not measured: the simulation has no equalization or per-tensor weights"
            )
            check = SuggestionCheck(fqn=fqn, change=change, before=before, alone=math.nan, kept=True,
                                    reason=reason + "; applied as suggested")
        checks.append(check)
    return tuple(checks), start


__all__ = ["check_suggestions", "is_default", "mode_of"]
