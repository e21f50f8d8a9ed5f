"""A top-1 target held at its confidence bound: Wilson's interval over the evaluation rows."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import qinsight
from qinsight.examples import example
from qinsight.planning.scores import agreeing_needed, rows_needed, wilson_lower
from qinsight.types import NoteKind


@given(st.integers(1, 400), st.sampled_from((0.8, 0.9, 0.95, 0.99)))
def test_every_row_agreeing_bounds_top1_at_n_over_n_plus_z_squared(rows: int, confidence: float) -> None:
    z = statistics.NormalDist().inv_cdf(confidence)
    assert wilson_lower(rows, rows, confidence) == pytest.approx(rows / (rows + z * z), rel=1e-12)
    # one more row agreeing never lowers the bound, and the bound is under the share itself
    bounds = [wilson_lower(k, rows, confidence) for k in range(rows + 1)]
    assert all(a < b for a, b in zip(bounds, bounds[1:]))
    assert all(bound <= k / rows for k, bound in enumerate(bounds))


@given(st.floats(0.3, 0.995), st.sampled_from((0.8, 0.9, 0.95, 0.99)))
def test_rows_needed_is_the_fewest_rows_that_all_agreeing_bound_the_target(threshold: float, confidence: float) -> None:
    least = rows_needed(threshold, confidence)
    assert least is not None
    assert agreeing_needed(threshold, least, confidence) == least
    assert least == 1 or agreeing_needed(threshold, least - 1, confidence) is None
    assert rows_needed(1.0, confidence) is None


def test_a_top1_target_held_at_its_bound_makes_the_config_agree_on_more_rows(tmp_path: Path) -> None:
    """``confidence=``: the search and the verification hold top-1 at Wilson's lower bound over the
    evaluation rows, so the plan claims its target only where enough rows agree for rows like them
    to reach it; the plan says so and keeps the target as asked."""
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(8)
    evaluation = data[3:]
    rows = sum(len(batch) for batch in evaluation)
    needed = agreeing_needed(0.9, rows, 0.95)
    assert needed is not None and needed > math.ceil(0.9 * rows)  # stricter than the share itself
    report = qinsight.diagnose(model, data[:3])
    plan = qinsight.plan(
        model, data[:3], evaluation, goal=qinsight.types.Goal(target="top1>=0.9", confidence=0.95), report=report
    )
    assert plan.confidence == 0.95 and str(plan.target) == "top1>=0.9"
    agreeing = round(plan.verified_score * rows)
    assert plan.reached == (agreeing >= needed)
    assert plan.reached or plan.quantized_fraction == 0.0  # what misses keeps everything it can in float
    (bound,) = [note.text for note in plan.notes if note.kind is NoteKind.AT_BOUND]
    assert str(needed) in bound and "95%" in bound  # the words say how many rows had to agree
    qinsight.save_report(report.with_plan(plan), tmp_path / "plan.json")
    loaded = qinsight.load_report(tmp_path / "plan.json").plan
    assert loaded is not None and loaded.confidence == 0.95


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"target": "sqnr>=30", "confidence": 0.95}, "confidence=0.95 is invalid; expected a one-sided confidence"),
        ({"target": "top1>=0.9", "confidence": 1.0}, "confidence=1.0 is invalid"),
        ({"target": "top1>=0.9", "confidence": 0.95, "batches": 2}, "at least 25 rows, or confidence=None"),
        ({"target": "top1>=1.0", "confidence": 0.95}, "a threshold under 1"),
    ],
)
def test_a_confidence_the_evaluation_data_cannot_hold_is_one_error(arguments: dict[str, object], expected: str) -> None:
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(5)
    batches = int(arguments.pop("batches", 2))  # type: ignore[call-overload]
    with pytest.raises(qinsight.errors.InvalidParameterError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        qinsight.plan(model, data[:3], data[3 : 3 + batches], **arguments)  # type: ignore[arg-type]
