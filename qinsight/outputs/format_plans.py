"""A mixed-format plan as summary lines and titled tables: the verdict first (target, score for real on
the search and the held-out data, mean bits, the uniform formats beside it), then the formats by
role, the size-quality curve, the other rankings at the plan's bits, and the costliest layers."""

from __future__ import annotations

import math

from qinsight.core.formats import CurvePoint, FormatPlan
from qinsight.outputs.roles import role_of
from qinsight.outputs.tables import DEFAULT_LIMIT, Table, tables_as_text


def _score(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else ("not measured" if math.isnan(value) else str(value))


def _point(point: CurvePoint, confidence: float | None = None) -> str:
    bound = (
        f" (bound {_score(point.bound)} at {confidence:.0%})"
        if confidence is not None and not math.isnan(point.bound)
        else ""
    )
    held = f", held out {_score(point.held_out)}" if not math.isnan(point.held_out) else ""
    return f"{_score(point.score)}{bound}{held} at {point.mean_bits:.2f} bits"


def verdict(plan: FormatPlan) -> str:
    """What held, each part of the goal on its own: the budget, and the target as the search holds it
    (at its bound where there is one; a target the score meets only beside a bound that misses says so)."""
    parts = []
    if plan.target is not None:
        if plan.target_held:
            parts.append(f"{plan.target} reached")
        elif plan.target_by_score:
            at = f"at its {plan.confidence:.0%} bound" if plan.confidence is not None else "as held"
            parts.append(f"{plan.target} NOT reached {at} (met by the score alone)")
        else:
            parts.append(f"{plan.target} NOT reached")
    if plan.budget is not None:
        parts.append(f"{plan.budget} {'held' if plan.budget_held else 'NOT held'}")
    return "; ".join(parts) or "no target, no budget"


def format_summary(plan: FormatPlan) -> list[str]:
    """The verdict, against the uniform formats, and how many layers take each format."""
    counts = ", ".join(f"{count} {name}" for name, count in sorted(plan.counts().items()))
    scored = f"{plan.metric} {_point(plan.chosen, plan.confidence)} per weight"
    lines = [
        f"Format plan (torchao quantize_, {', '.join(plan.formats)}): {verdict(plan)}: {scored}",
        f"  {len(plan.layers)} Linears: {counts}; {plan.chosen.state_bytes / 1e6:.1f} MB of weights as stored; "
        f"{plan.evaluations} runs quantized for real",
    ]
    lines.extend(
        f"  uniform {point.label.removeprefix('uniform ')}: {_point(point, plan.confidence)}" for point in plan.uniform
    )
    lines.append("  qinsight.quantize(model, plan) or quantize_(model, qinsight.fqn_to_config(plan)) applies it")
    lines.extend(f"  note: {note}" for note in plan.notes)
    return lines


def roles_table(plan: FormatPlan, limit: int = DEFAULT_LIMIT) -> Table:
    """How many of each repeated role's layers take each format (``layers.*.mlp.down_proj``)."""
    roles: dict[str, dict[str, int]] = {}
    for layer in plan.layers:
        counts = roles.setdefault(role_of(layer.fqn), {})
        counts[layer.format] = counts.get(layer.format, 0) + 1
    rows = tuple(
        (role, ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))) for role, counts in roles.items()
    )
    return Table(
        "Formats by role",
        ("layers", "formats"),
        rows[: max(limit, 20)],
        "" if len(rows) <= max(limit, 20) else "more in the file",
    )


def curve_table(plan: FormatPlan) -> Table:
    """The plan's ranking at several sizes and the uniform formats, all quantized for real, most bits first."""
    points = sorted((*plan.curve, *plan.uniform), key=lambda p: (-p.mean_bits, p.label))
    bound = (
        (f"search, {plan.confidence:.0%} bound",) if plan.confidence is not None else ()
    )  # the column, where the search held one
    rows = tuple(
        (
            p.label,
            f"{p.mean_bits:.2f}",
            f"{p.state_bytes / 1e6:.1f}",
            _score(p.score),
            *((_score(p.bound),) if bound else ()),
            _score(p.held_out),
        )
        for p in points
    )
    return Table(
        f"Size against quality ({plan.metric}, quantized for real)",
        ("assignment", "bits", "MB", "search", *bound, "held out"),
        rows,
    )


def orders_table(plan: FormatPlan) -> Table:
    """The plan's bits spent by each ranking of the layers, scored for real."""
    rows = tuple(
        (
            o.order + (" (the plan)" if o.order == plan.order else ""),
            f"{o.point.mean_bits:.2f}",
            _score(o.point.score),
            _score(o.point.held_out),
            f"{o.searched.mean_bits:.2f} bits, {_score(o.searched.score)}" if o.searched is not None else "",
        )
        for o in plan.orders
    )
    return Table(
        f"Rankings at the plan's size ({plan.metric}, quantized for real)",
        ("ranked by", "bits", "search", "held out", "its own search chose"),
        rows,
    )


def costs_table(plan: FormatPlan, limit: int = DEFAULT_LIMIT) -> Table:
    """The layers that cost most in their cheapest format, alone: where the bits go."""
    ranked = sorted(plan.costs, key=lambda c: -c.damage)
    rows = tuple((c.fqn, c.format, f"{c.damage:.3g}", _score(c.score), plan.format_of(c.fqn)) for c in ranked[:limit])
    note = f"{len(ranked) - limit} more in the file" if len(ranked) > limit else ""
    return Table(
        f"Costliest layers alone (damage adds up over layers; {plan.metric} with only that layer quantized)",
        ("layer", "format", "damage", plan.metric, "planned"),
        rows,
        note,
    )


def format_tables(plan: FormatPlan, limit: int = DEFAULT_LIMIT) -> list[Table]:
    tables = [roles_table(plan, limit), curve_table(plan)]
    if plan.orders:
        tables.append(orders_table(plan))
    if plan.costs:
        tables.append(costs_table(plan, limit))
    return tables


def format_text(plan: FormatPlan) -> str:
    return "\n".join([*format_summary(plan), "", *tables_as_text(format_tables(plan))]).rstrip("\n") + "\n"


__all__ = [
    "costs_table",
    "curve_table",
    "format_summary",
    "format_tables",
    "format_text",
    "orders_table",
    "roles_table",
]
