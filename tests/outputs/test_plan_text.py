"""A plan as text: what the user decides first (the headline, the program's speed and size, the sites
kept in float), and the rows that change nothing one line each."""

from __future__ import annotations

import attrs

import qinsight
from qinsight.core.comparison import ProgramCost
from qinsight.core.notes import NoteKind
from qinsight.core.plan import PlanStep, SuggestionCheck, Target
from qinsight.core.suggestions import QuantSuggestion
from qinsight.core.verification import SuggestionKind
from qinsight.outputs.plans import check_table, curve_table, summary_lines


def _plan(**fields: object) -> qinsight.QuantPlan:
    return qinsight.QuantPlan(
        flow="pt2e",
        backend="xnnpack",
        metric="top1",
        target=Target.parse("top1>=0.93"),
        reached=True,
        default_score=0.9,
        verified_score=0.94,
        **fields,  # type: ignore[arg-type]
    )


def test_a_plan_whose_program_is_slower_than_float_says_so_first() -> None:
    programs = qinsight.types.PlanPrograms(
        planned=ProgramCost(latency_ms=35.7, size_bytes=4_000_000),
        default=ProgramCost(latency_ms=15.5, size_bytes=3_600_000),
        float_model=ProgramCost(latency_ms=30.6, size_bytes=14_000_000),
    )
    plan = _plan(programs=programs)
    first, headline, *rest = summary_lines(plan)
    assert first == "SLOWER THAN FLOAT: the plan's program runs 35.7 ms a batch, the float program 30.6 ms (0.86x)"
    assert headline.startswith("Plan (pt2e, backend xnnpack): target top1>=0.93 reached")
    assert "  program: the program runs 35.7 ms a batch, 0.86x the float program's speed (SLOWER than" in rest[1]
    faster = attrs.evolve(plan, programs=attrs.evolve(programs, planned=programs.default))
    assert summary_lines(faster)[0].startswith("Plan (pt2e")


def test_checks_that_change_nothing_are_one_row_for_all_their_sites() -> None:
    def check(site: str, why: NoteKind, kept: bool, reason: str, alone: float = 0.9) -> SuggestionCheck:
        change, kinds = ("equalize", (SuggestionKind.EQUALIZE,)) if why is NoteKind.UNEQUALIZED else ("static", ())
        return SuggestionCheck(
            fqn=site, change=change, kinds=kinds, before=0.9, alone=alone, kept=kept, reason=reason, why=why
        )

    default = "what the flow's default config does already"
    unequalized = "not applied: the pt2e flow has no input-weight equalization"
    checks = (
        *(check(f"features.{i}", NoteKind.ALREADY_DEFAULT, True, default) for i in range(12)),
        *(check(f"features.{i}", NoteKind.UNEQUALIZED, False, unequalized, float("nan")) for i in range(2)),
        check("classifier", NoteKind.HURTS, False, "not applied: -0.02 on the output", 0.88),
    )
    rows = check_table(_plan(checks=checks)).rows
    assert [row[0] for row in rows] == [  # dropped first, then kept
        "classifier",
        "features.0, features.1",
        "12 sites: features.0, features.1, features.2 and 9 more",
    ]
    assert rows[0][2:] == ("0.9", "0.88", "-0.02", "no", "not applied: -0.02 on the output")
    assert rows[1][5:] == ("no", unequalized) and rows[2][5:] == ("yes", default)


def test_float_islands_are_the_runs_of_consecutive_float_sites_in_the_graphs_order() -> None:
    from qinsight.core.plan import float_islands

    order = ["stem", "a", "b", "c", "d", "head"]
    assert float_islands(order, set()) == 0
    assert float_islands(order, {"stem", "a", "head"}) == 2 and float_islands(order, {"a", "c"}) == 2
    assert float_islands(order, set(order)) == 1 and float_islands(order, {"b", "elsewhere"}) == 1
    floats = tuple(QuantSuggestion(fqn=fqn, keep_float=True) for fqn in ("stem", "a", "head"))
    said = summary_lines(_plan(float_islands=2, suggestions=floats, quantized_fraction=0.9))[1]
    assert said.startswith("  90.0% of the layers' parameters quantized; 3 sites kept in float in 2 islands; ")


def test_a_step_stopped_once_its_miss_was_certain_reads_as_at_most_its_score() -> None:
    steps = (
        PlanStep(fqn="", score=0.5, kept=True, quantized_fraction=0.0, stage="start"),
        PlanStep(fqn="features.3", score=0.95, kept=True, quantized_fraction=0.4, stage="curve", mode="static"),
        PlanStep(fqn="features.4", score=0.9167, kept=False, quantized_fraction=0.4, stage="refine", settled_after=2),
        PlanStep(fqn="features.5", score=0.92, kept=False, quantized_fraction=0.4, stage="refine"),
    )
    rows = curve_table(_plan(steps=steps)).rows
    assert rows[2] == ("features.4", "<= 0.9167", "kept in float (missed for certain after 2 batches)", "40.0%")
    assert rows[3] == ("features.5", "0.92", "kept in float", "40.0%")
