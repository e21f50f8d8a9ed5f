"""The report as text for people: per detector, one line per actionable module.

Findings that need no action are summarized in one line per verdict; the full
detail stays in the typed findings and the file.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

from qinsight.core.comparison import Comparison
from qinsight.core.findings import Finding
from qinsight.core.flows import flow_spec, reads_as_is, report_flow
from qinsight.core.formats import FormatPlan
from qinsight.core.plan import QuantPlan
from qinsight.core.report import DetectorResult, Report
from qinsight.outputs.diff import ReportDiff
from qinsight.outputs.format_plans import format_summary, format_tables, format_text
from qinsight.outputs.plans import plan_tables, plan_text, summary_lines
from qinsight.outputs.roles import Layout, by_role, capped, role_counts
from qinsight.outputs.tables import comparison_tables, tables_as_text
from qinsight.outputs.verdicts import verification_lines

# Terms the detectors' reasons use (the text that marks them, the term, its meaning), explained
# once below the report where they appear.
LEGEND = (
    ("S_in=", "S_in, S_out", "how stable the input's/output's range is from batch to batch (1: the same every batch)"),
    (" s_c ", "s_c", "sqrt(weight range / input range) of a channel, both normalized: the scale equalization applies"),
    ("max/p", "max/pNN", "a channel's max |x| over its NN-th percentile: large ratios are outliers"),
)


def _names(findings: Sequence[Finding], layout: Layout) -> str:
    shown = findings if len(findings) <= layout.names + 1 else findings[: layout.names]
    more = len(findings) - len(shown)
    return ", ".join(f.fqn for f in shown) + (f" and {more} more (--all lists them)" if more > 0 else "")


def _rows(rows: Sequence[tuple[str, str]], indent: str, separator: str = "  ") -> list[str]:
    width = max(len(name) for name, _ in rows)
    return [f"{indent}{name:<{width}}{separator}{text}" for name, text in rows]


def shared_tail(reasons: Sequence[str]) -> str:
    """The last ``"; "``-separated parts that every one of several reasons ends with (each keeps its first
    part), or ``""``."""
    if len(reasons) < 2:
        return ""
    split = [reason.split("; ") for reason in reasons]
    shared: list[str] = []
    for parts in zip(*(reversed(p[1:]) for p in split)):
        if len(set(parts)) > 1:
            break
        shared.append(parts[0])
    return "; ".join(reversed(shared))


def _group(findings: Sequence[Finding]) -> dict[str, list[Finding]]:
    groups: dict[str, list[Finding]] = {}
    for finding in findings:
        groups.setdefault(finding.verdict, []).append(finding)
    return groups


def _result_lines(result: DetectorResult, layout: Layout) -> list[str]:
    params = ", ".join(f"{p.name}={p.value}" for p in result.parameters)
    lines = [f"{result.detector}" + (f" ({params})" if params else "")]
    if not result.findings:
        lines.append("  no applicable modules")
    suggested = {s.fqn for s in result.suggestions if not s.changes_nothing}
    for verdict, group in _group(result.findings).items():
        reasons = {f.reason() for f in group}
        if group[0].actionable and len(reasons) == 1 and len(group) > 1:
            lines.append(f"  {verdict} ({len(group)}): {_names(group, layout)} -- {reasons.pop()}")
        elif group[0].actionable:
            lines.extend(_actionable_lines(verdict, group, layout, any(f.fqn in suggested for f in group)))
        else:
            lines.append(f"  {verdict} ({len(group)}): {_names(group, layout)}")
    return lines


def _actionable_lines(verdict: str, group: Sequence[Finding], layout: Layout, suggests: bool) -> list[str]:
    """A verdict to act on: a row per module (per role in a long section), as many as the ``layout``
    shows; one line where the detector suggested nothing for any of them (an LLM's 90
    "equalization recommended, FX cannot equalize a Linear on 3-D inputs")."""
    reasons_of = [f.reason() for f in group]
    tail = shared_tail(reasons_of)
    if tail:  # said once: "FX cannot equalize a Linear on 3-D inputs: not suggested" for 102 modules
        reasons_of = [reason[: -len(tail) - 2] for reason in reasons_of]
    head = f"  {verdict} ({len(group)})" + (f", each: {tail}" if tail else "")
    if not suggests and not layout.short(len(group)):
        return [
            f"{head}{'' if tail else ', nothing suggested'}: {role_counts([f.fqn for f in group])} (--all gives each)"
        ]
    severity = {f.fqn: value for f in group if (value := _severity(f)) is not None}
    grouped = by_role([(f.fqn, r) for f, r in zip(group, reasons_of)], layout, same_text=False, severity=severity)
    rows, more = capped(grouped, layout)
    return [head + ":", *_rows(rows, "    "), *([f"    ... and {more} more roles (--all lists them)"] if more else [])]


def render_text(report: Report, *, everything: bool = False) -> str:
    """The report for people; ``everything`` names every module instead of the first few per line."""
    layout = Layout.full() if everything else Layout()
    if report.comparison is not None and not report.sites:  # a file holding a comparison only
        return _comparison_lines(report, report.comparison) + "\n"
    meta = report.metadata
    layers = sum(1 for site in report.sites if site.kind.is_layer)
    ops = [site for site in report.sites if not site.kind.is_layer]
    around = f", {len(ops)} ops around them ({sum(not op.quantized for op in ops)} float in the flow)" if ops else ""
    lines = [
        f"qinsight report: {meta.model} ({meta.frontend} frontend, backend {meta.backend}, "
        f"{meta.batches} calibration batches, {layers} quantizable modules{around})",
        "",
    ]
    if report.plan is not None:  # the answer first: what the plan reached, for real; its detail at the end
        lines.extend([*summary_lines(report.plan), ""])
    if report.formats is not None:
        lines.extend([*format_summary(report.formats), ""])
    for result in report.results:
        lines.extend(_result_lines(result, layout))
        lines.append("")
    lines.append(f"Suggested config ({len(report.suggestions)} modules):")
    if report.plan is not None:
        method = flow_spec(report.plan.flow).call("report")
        if report.plan.starts_from:  # the plan's config is the user's quantizer, given again
            method = method.replace(")", f", quantizer=<your {report.plan.starts_from}>)")
        lines.append(f"  {method} gives the plan's config below instead: the suggestions it kept, its sites in float")
    lines.extend(_config_lines(report, layout))
    lines.extend(_conflict_lines(report, layout))
    if len(report.equalization_mapping):
        lines.append(
            f"Equalize: {', '.join(report.equalization_mapping.fqns)} "
            "(prepare_fx's _equalization_config; PT2E has no equalization)"
        )
    lines.extend(_config_call_lines(report))
    lines.extend(verification_lines(report))
    refused = report.equalization_mapping.refused
    if refused:
        lines.append(f"Not equalized ({len(refused)}), though suggested:")
        lines.extend(f"  {r.fqn}: {r.reason}" for r in refused)
    kept = _kept_float(report)
    # a long section's are named by role on the config's "keep in float" line, their findings above saying why
    if kept and layout.short(len(kept)):
        lines.append(f"Kept in float ({len(kept)}), and why:")
        lines.extend(f"  {fqn}: {why}" for fqn, why in by_role(kept, layout, same_text=False))
    notes = _notes(report)
    if notes:
        lines.append("")
        lines.append("Notes:")
        lines.extend(f"  {note}" for note in notes)
    if report.comparison is not None:
        lines.extend(["", _comparison_lines(report, report.comparison)])
    tables = (plan_tables(report.plan) if report.plan is not None else []) + (
        format_tables(report.formats) if report.formats is not None else []
    )
    if tables:
        lines.extend(["", *tables_as_text(tables)])
        while lines and not lines[-1]:
            lines.pop()
    lines.extend(_legend("\n".join(lines)))
    return "\n".join(lines) + "\n"


def render_plan(plan: QuantPlan) -> str:
    """A plan for people: what it reached, the suggestions it checked, the sensitivities, the search."""
    return plan_text(plan)


def comparison_text(comparison: Comparison, limit: int = 10) -> str:
    """A comparison's tables, worst layers first, ``limit`` rows each."""
    return "\n".join(tables_as_text(comparison_tables(comparison, limit)))


def to_text(
    value: Report | QuantPlan | FormatPlan | Comparison | ReportDiff, *, everything: bool = False, limit: int = 10
) -> str:
    """Any of qinsight's results as text for people.

    Args:
        value: a report, a plan, a format plan, a comparison or a diff of two reports.
        everything: (a report) name every module instead of the first few per line.
        limit: (a comparison) rows per table.

    Returns:
        The text, one string of lines.
    """
    if isinstance(value, Report):
        return render_text(value, everything=everything)
    if isinstance(value, QuantPlan):
        return render_plan(value)
    if isinstance(value, FormatPlan):
        return format_text(value)
    if isinstance(value, Comparison):
        return comparison_text(value, limit)
    return value.to_text()


def _legend(text: str) -> list[str]:
    used = [f"{term}: {meaning}" for mark, term, meaning in LEGEND if mark in text]
    heading = "Terms (docs/detectors.md has each detector's rule):"
    if len(used) == 1:  # one term: on the heading's line (an LLM's report keeps to one screen)
        return ["", f"{heading} {used[0]}"]
    return ["", heading, *(f"  {line}" for line in used)] if used else []


def _comparison_lines(report: Report, comparison: Comparison) -> str:
    against = f" ({comparison.quantized})" if comparison.quantized else ""
    return f"Float vs quantized{against}: {report.metadata.model}\n\n" + comparison_text(comparison).rstrip("\n")


def _severity(finding: Finding) -> float | None:
    """A finding's :meth:`~qinsight.core.findings.Finding.severity`; ``None`` for a plugin's finding that
    predates it or whose own raises (the text then keeps the detector's order)."""
    try:
        value = finding.severity()
    except Exception:
        return None
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _config_lines(report: Report, layout: Layout) -> list[str]:
    """The suggested config, a row per module (per role in a long section); the modules kept in float
    one line by role in a long section."""
    entries = [(s.fqn, s.describe()) for s in report.suggestions]
    floats = [s.fqn for s in report.suggestions if s.keep_float]
    if layout.short(len(entries)) or len(floats) <= 1:
        return _rows(by_role(entries, layout, same_text=True), "  ") if entries else []
    quantized = [(s.fqn, s.describe()) for s in report.suggestions if not s.keep_float]
    rows = _rows(by_role(quantized, layout, same_text=True), "  ") if quantized else []
    return [*rows, f"  keep in float ({len(floats)}): {role_counts(floats)}"]


def _config_call_lines(report: Report) -> list[str]:
    """The call that gives the user the config, where it is not FX's mapping (the report's backend or
    model is another flow's) and no verdict below names it, and how FX's mapping observes activations
    where it is."""
    plan, meta = report.plan, report.metadata
    flow = plan.flow if plan is not None else report_flow(meta.frontend, meta.backend)
    if not flow_spec(flow).observes_activations:
        if plan is not None or report.verification:
            return []  # the plan's line above names its call, as the verification's below does
        title = flow_spec(flow).title
        traced = reads_as_is(meta.frontend)
        why = (
            f"{meta.backend} quantizes through {title}"
            if traced
            else (f"FX cannot trace this model; {title} quantizes what torch.export exports")
        )
        return [f"{flow_spec(flow).call('report')} gives this config: {why}"]
    # an FX plan's config is the report's: its observing, checked by the plan, is what the mapping uses
    observing = plan.fx_activations if plan is not None else report.fx_activations
    return [f"qinsight.qconfig_mapping(report): {observing.describe()}"] if observing is not None else []


def _conflict_lines(report: Report, layout: Layout) -> list[str]:
    """Each conflict between detectors; in a long section, one line per field and choice, naming who said what."""
    if layout.short(len(report.conflicts)):
        conflicts = [
            (f"{c.fqn}.{c.field}", f"{', '.join(f'{o.detector}={o.value}' for o in c.opinions)}; chose {c.chosen}")
            for c in report.conflicts
        ]
        return [f"  conflict on {name}: {text}" for name, text in by_role(conflicts, layout, same_text=True)]
    said: dict[tuple[str, str], dict[str, set[str]]] = {}
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for conflict in report.conflicts:
        key = (conflict.field, conflict.chosen)
        counts[key] += 1
        for opinion in conflict.opinions:
            said.setdefault(key, {}).setdefault(opinion.value, set()).update(opinion.detector.split(","))
    return [
        f"  conflicts on {field} ({counts[field, chosen]} modules): "
        + "; ".join(f"{', '.join(sorted(detectors))} said {value}" for value, detectors in said[field, chosen].items())
        + f"; chose {chosen} (--all lists them)"
        for field, chosen in counts
    ]


def _kept_float(report: Report) -> list[tuple[str, str]]:
    """Each site a suggestion keeps in float, with the reason of the findings that asked for it."""
    reasons = {
        (finding.fqn, result.detector): finding.reason() for result in report.results for finding in result.findings
    }
    return [
        (s.fqn, "; ".join(reasons.get((s.fqn, source), source) for source in s.sources))
        for s in report.suggestions
        if s.keep_float
    ]


def _notes(report: Report) -> list[str]:
    notes = [
        f"{site.fqn} runs {site.calls} times per forward; its statistics cover every call"
        for site in report.sites
        if site.calls > 1
    ]
    notes.extend(
        f"{o.key}: {o.stats.nonfinite_batches} of {o.stats.batches + o.stats.nonfinite_batches} batches held "
        "NaN/Inf and were left out of its statistics"
        for o in report.observations
        if o.stats.nonfinite_batches
    )
    notes.extend(f"detector {f.detector} failed at {f.stage.value}: {f.error}" for f in report.failures)
    return notes
