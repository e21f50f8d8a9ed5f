"""merge_suggestions: accuracy-first precedence, recorded conflicts, order independence."""

from __future__ import annotations

import itertools

from qinsight.core.suggestions import Opinion, SuggestionConflict, merge_suggestions
from qinsight.types import ActivationMode, QuantSuggestion, WeightScheme


def s(fqn: str, source: str, **fields: object) -> QuantSuggestion:
    return QuantSuggestion(fqn=fqn, sources=(source,), **fields)  # type: ignore[arg-type]


def test_agreeing_opinions_merge_without_conflict() -> None:
    merged, conflicts = merge_suggestions(
        [s("fc", "a", weight=WeightScheme.PER_CHANNEL), s("fc", "b", activation=ActivationMode.STATIC)]
    )
    assert merged == (
        QuantSuggestion(
            fqn="fc", activation=ActivationMode.STATIC, weight=WeightScheme.PER_CHANNEL, sources=("a", "b")
        ),
    )
    assert conflicts == ()


def test_conflicts_choose_accuracy_and_are_recorded() -> None:
    suggestions = [
        s("fc", "a", activation=ActivationMode.STATIC, weight=WeightScheme.PER_TENSOR),
        s("fc", "b", activation=ActivationMode.DYNAMIC, keep_float=False),
        s("fc", "c", weight=WeightScheme.PER_CHANNEL, keep_float=True),
        s("conv", "a", equalize=False),
        s("conv", "b", equalize=True),
    ]
    merged, conflicts = merge_suggestions(suggestions)
    fc, conv = merged
    assert (fc.activation, fc.weight, fc.keep_float) == (ActivationMode.DYNAMIC, WeightScheme.PER_CHANNEL, True)
    assert conv.equalize is True
    assert fc.describe() == "keep in float"
    assert conflicts[0] == SuggestionConflict(
        fqn="fc",
        field="activation",
        opinions=(Opinion(detector="a", value="static"), Opinion(detector="b", value="dynamic")),
        chosen="dynamic",
    )
    assert [(c.fqn, c.field, c.chosen) for c in conflicts] == [
        ("fc", "activation", "dynamic"),
        ("fc", "weight", "per_channel"),
        ("fc", "keep_float", "true"),
        ("conv", "equalize", "true"),
    ]


def test_merged_result_does_not_depend_on_order() -> None:
    suggestions = [
        s("fc", "a", activation=ActivationMode.STATIC),
        s("fc", "b", activation=ActivationMode.DYNAMIC),
        s("fc", "c", weight=WeightScheme.PER_TENSOR),
    ]
    results = {merge_suggestions(p)[0] for p in itertools.permutations(suggestions)}
    assert len(results) == 1
