"""A plan as summary lines and titled tables, which the text and the HTML outputs lay out."""

from __future__ import annotations

import math

from qinsight.core.notes import NoteKind
from qinsight.core.plan import PlanStep, QuantPlan
from qinsight.outputs.tables import DEFAULT_LIMIT, Table, tables_as_text


def _score(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else "not measured"


def _delta(value: float) -> str:
    return f"{value:+.3g}" if math.isfinite(value) else "not measured"


def summary_lines(plan: QuantPlan) -> list[str]:
    """What the plan reached, against what, what its program costs (a program slower than the float
    one said first) and what it keeps in float."""
    verdict = "reached" if plan.reached else "NOT reached"
    floats = plan.kept_float
    start = f", on top of your {plan.starts_from}" if plan.starts_from else ""
    programs = plan.programs
    lines = []
    if programs is not None and programs.slower_than_float:
        lines.append(
            f"SLOWER THAN FLOAT: the plan's program runs {programs.planned.latency_ms:.3g} ms a batch, the float "
            f"program {programs.float_model.latency_ms:.3g} ms ({programs.speedup:.2f}x)"
        )
    lines += [
        f"Plan ({plan.flow}, backend {plan.backend}{start}): "
        f"target {plan.aim} {verdict}: {plan.metric} "
        f"{_score(plan.verified_score)} quantized for real"
        + (f" and lowered ({plan.lowered})" if plan.lowered else "")
        + (f", {_score(plan.held_out_score)} on held-out data" if not math.isnan(plan.held_out_score) else "")
        + f", the flow's default config {_score(plan.default_score)}",
        f"  {plan.quantized_fraction:.1%} of the layers' parameters quantized; {len(floats)} sites kept in float"
        + (f" in {plan.float_islands} island{'s' if plan.float_islands > 1 else ''}" if plan.float_islands else "")
        + "; "
        f"{plan.evaluations} simulated evaluations of the data",
    ]
    if programs is not None:
        lines.append(f"  program: {programs.describe()}")
    if floats:
        shown = ", ".join(floats[:DEFAULT_LIMIT]) + (
            f" and {len(floats) - DEFAULT_LIMIT} more" if len(floats) > DEFAULT_LIMIT else ""
        )
        lines.append(f"  kept in float: {shown}")
    if plan.cost is not None:
        lines.append(f"  time: {plan.cost.describe()}")
    if plan.smoothing.entries:
        count, alphas = len(plan.smoothing), sorted({entry.alpha for entry in plan.smoothing.entries})
        which = "the input of 1 Linear" if count == 1 else f"the inputs of {count} Linears"
        strength = f"{alphas[0]:g}" if len(alphas) == 1 else f"{alphas[0]:g}-{alphas[-1]:g}"
        lines.append(
            f"  smoothed {which} (alpha {strength}): the config is for qinsight.smoothed(model, plan), "
            "where a smoothed Linear is named <name>.linear"
        )
    if plan.bias_correction.entries:
        lines.append(
            f"  biases corrected in {len(plan.bias_correction)} layers first, every layer int8: the config is for "
            "qinsight.bias_corrected(model, plan)"
        )
    equalized = plan.equalization_mapping().fqns
    if equalized:
        lines.append(f"  equalized: {', '.join(equalized)} (qinsight.equalization_config(plan) for prepare_fx)")
    if math.isfinite(plan.agreement):
        lines.append(
            "  Spearman between each site's cost quantized alone and its gain kept alone in float: "
            f"{plan.agreement:.2f}"
        )
    lines.extend(f"  note: {note}" for note in plan.notes)
    return lines


# Checks that change nothing the user decides (the default does it already, the flow cannot express
# it, the user's quantizer decides it): one row per kind of them, however many sites, not one per site.
_UNCHANGING = frozenset({NoteKind.ALREADY_DEFAULT, NoteKind.UNEQUALIZED, NoteKind.YOURS_DECIDES})


def _sites(fqns: list[str]) -> str:
    shown = ", ".join(fqns[:3])
    return shown if len(fqns) <= 3 else f"{len(fqns)} sites: {shown} and {len(fqns) - 3} more"


def check_table(plan: QuantPlan, limit: int = DEFAULT_LIMIT) -> Table:
    """The report's suggestions that changed something, each measured alone, dropped ones first; those
    that change nothing (:data:`_UNCHANGING`) one row for all the sites alike."""
    checks = sorted(plan.checks, key=lambda c: (c.kept, not c.measured))
    alike: dict[tuple[str, str, bool], list[str]] = {}
    rows: list[tuple[str, ...]] = []
    for c in checks:
        if c.why in _UNCHANGING:
            alike.setdefault((c.change, c.reason, c.kept), []).append(c.site)
            continue
        measured = _delta(c.effect) if c.measured else ""
        rows.append(
            (c.site, c.change, _score(c.before), _score(c.alone), measured, "yes" if c.kept else "no", c.reason)
        )
    for (change, reason, kept), fqns in alike.items():
        rows.append((_sites(fqns), change, "", "", "", "yes" if kept else "no", reason))
    shown = rows[:limit]
    note = f"{len(rows) - len(shown)} more in the file" if len(rows) > len(shown) else ""
    return Table(
        f"Suggestions, measured ({plan.metric}: default config, with it alone, what it adds among the others)",
        ("site", "change", "default", "alone", "among others", "kept", "why"),
        tuple(shown),
        note,
    )


def sensitivity_table(plan: QuantPlan, limit: int = DEFAULT_LIMIT) -> Table:
    """The sites whose quantization alone costs most: where precision matters."""
    ranked = sorted(plan.sensitivities, key=lambda s: s.quantized_only if plan.higher_is_better else -s.quantized_only)
    shown = ranked[:limit]
    rows = tuple(
        (s.fqn, s.kind, str(s.parameters), _score(s.quantized_only), _score(s.float_only), _delta(s.gain))
        for s in shown
    )
    note = f"{len(ranked) - len(shown)} more sites in the file" if len(ranked) > len(shown) else ""
    return Table(
        f"Sensitivity, costliest first ({plan.metric} with only the site quantized / only the site in float)",
        ("site", "kind", "parameters", "quantized alone", "float alone", "gain in float"),
        rows,
        note,
    )


def curve_table(plan: QuantPlan, limit: int = DEFAULT_LIMIT) -> Table:
    """The search's last steps: each site tried, the score, and whether it stayed quantized."""
    steps = plan.steps[-limit:]
    rows = tuple(
        (
            s.fqn or "(all candidates in float)",
            f"<= {_score(s.score)}" if s.settled_after else _score(s.score),
            f"quantized {s.mode}".strip() if s.kept else _floated(s),
            f"{s.quantized_fraction:.1%}",
        )
        for s in steps
    )
    note = f"the first {len(plan.steps) - len(steps)} steps are in the file" if len(plan.steps) > len(steps) else ""
    return Table(f"Search, last steps ({plan.metric} simulated)", ("site", "score", "then", "quantized"), rows, note)


def _floated(step: PlanStep) -> str:
    """A step the search left in float, and where it missed for certain before its last batch, when."""
    if not step.settled_after:
        return "kept in float"
    batches = f"{step.settled_after} batch{'es' if step.settled_after > 1 else ''}"
    return f"kept in float (missed for certain after {batches})"


def plan_tables(plan: QuantPlan, limit: int = DEFAULT_LIMIT) -> list[Table]:
    tables = [sensitivity_table(plan, limit), curve_table(plan, limit)]
    if any(c.measured or not c.kept for c in plan.checks):
        tables.insert(0, check_table(plan, limit))
    return tables


def plan_text(plan: QuantPlan) -> str:
    return "\n".join([*summary_lines(plan), "", *tables_as_text(plan_tables(plan))]).rstrip("\n") + "\n"


__all__ = ["check_table", "curve_table", "plan_tables", "plan_text", "sensitivity_table", "summary_lines"]
