"""What changed between two reports: a typed diff for review, and gates for CI.

Modules and detectors added or removed, verdicts and suggestions that changed,
numbers of findings that moved beyond a tolerance, comparison metrics per
layer, and every other field of the file (metadata, observations, conflicts,
failures, equalization, comparison tables…) as ``FieldChange``\\ s at their
JSON path. Two reports that differ in anything give a non-empty diff when the
tolerances are zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, cast

import attrs

from qinsight.core.comparison import Comparison
from qinsight.core.findings import Finding
from qinsight.core.report import Report
from qinsight.outputs.fields import field_changes, numbers_differ


@attrs.frozen(kw_only=True)
class VerdictChange:
    detector: str
    fqn: str
    before: str
    after: str
    actionable_before: bool = False
    actionable_after: bool = False


@attrs.frozen(kw_only=True)
class NumberChange:
    detector: str
    fqn: str
    field: str
    before: float
    after: float


@attrs.frozen(kw_only=True)
class SuggestionChange:
    fqn: str
    before: str
    after: str


@attrs.frozen(kw_only=True)
class MetricChange:
    """A comparison metric of one layer: ``section`` is ``weights``, ``activations`` or ``activations (local)``."""

    section: str
    fqn: str
    metric: str
    before: float
    after: float


@attrs.frozen(kw_only=True)
class FieldChange:
    """Any other field that differs, at its JSON path in the report file (``None``: absent on that side)."""

    path: str
    before: str | None
    after: str | None


@attrs.frozen(kw_only=True)
class ReportDiff:
    modules_added: tuple[str, ...] = ()
    modules_removed: tuple[str, ...] = ()
    detectors_added: tuple[str, ...] = ()
    detectors_removed: tuple[str, ...] = ()
    verdicts: tuple[VerdictChange, ...] = ()
    numbers: tuple[NumberChange, ...] = ()
    suggestions: tuple[SuggestionChange, ...] = ()
    metrics: tuple[MetricChange, ...] = ()
    fields: tuple[FieldChange, ...] = ()

    @property
    def empty(self) -> bool:
        return not any(attrs.astuple(self, recurse=False))

    def sqnr_drops(self) -> tuple[tuple[MetricChange, float], ...]:
        """Each SQNR that fell, with its drop in dB, largest first."""
        drops = [(m, m.before - m.after) for m in self.metrics if m.metric == "sqnr" and m.after < m.before]
        return tuple(sorted(drops, key=lambda item: -item[1] if not math.isnan(item[1]) else 0.0))

    def to_text(self) -> str:
        if self.empty:
            return "no differences\n"
        lines = [
            f"{label}: {', '.join(items)}"
            for label, items in (
                ("modules added", self.modules_added),
                ("modules removed", self.modules_removed),
                ("detectors added", self.detectors_added),
                ("detectors removed", self.detectors_removed),
            )
            if items
        ]
        lines += [f"{v.detector} {v.fqn}: {v.before} -> {v.after}" for v in self.verdicts]
        lines += [f"suggestion {s.fqn}: {s.before} -> {s.after}" for s in self.suggestions]
        lines += [f"{n.detector} {n.fqn}.{n.field}: {n.before:.4g} -> {n.after:.4g}" for n in self.numbers]
        lines += [f"{m.section} {m.fqn} {m.metric}: {m.before:.4g} -> {m.after:.4g}" for m in self.metrics]
        lines += [f"{f.path}: {_shown(f.before)} -> {_shown(f.after)}" for f in self.fields]
        return "\n".join(lines) + "\n"


def _shown(value: str | None) -> str:
    return "(absent)" if value is None else value


def _scalars(value: attrs.AttrsInstance, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted name, number) for every int/float field of an attrs value, nested ones included."""
    for field in attrs.fields(type(value)):
        item = getattr(value, field.name)
        name = prefix + field.name
        if isinstance(item, bool):
            continue
        if isinstance(item, (int, float)):
            yield name, float(item)
        elif attrs.has(type(item)):
            yield from _scalars(cast(attrs.AttrsInstance, item), name + ".")


def _findings(report: Report) -> dict[tuple[str, str], Finding]:
    return {(r.detector, f.fqn): f for r in report.results for f in r.findings}


def _finding_changes(
    a: Report, b: Report, rel_tol: float, abs_tol: float
) -> tuple[list[VerdictChange], list[NumberChange]]:
    findings_b = _findings(b)
    verdicts: list[VerdictChange] = []
    numbers: list[NumberChange] = []
    for (detector, fqn), before in _findings(a).items():
        after = findings_b.get((detector, fqn))
        if after is None:
            continue
        if before.verdict != after.verdict:
            verdicts.append(
                VerdictChange(
                    detector=detector,
                    fqn=fqn,
                    before=before.verdict,
                    after=after.verdict,
                    actionable_before=before.actionable,
                    actionable_after=after.actionable,
                )
            )
        if type(before) is type(after):
            new_values = dict(_scalars(after))
            numbers.extend(
                NumberChange(detector=detector, fqn=fqn, field=name, before=old, after=new_values[name])
                for name, old in _scalars(before)
                if name in new_values and numbers_differ(old, new_values[name], rel_tol, abs_tol)
            )
    return verdicts, numbers


def _metric_changes(a: Comparison | None, b: Comparison | None, rel_tol: float, abs_tol: float) -> list[MetricChange]:
    changes: list[MetricChange] = []
    if a is None or b is None:
        return changes
    sections: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    if a.weights is not None and b.weights is not None:
        sections.append(
            ("weights", {r.fqn: r.metrics for r in a.weights.layers}, {r.fqn: r.metrics for r in b.weights.layers})
        )
    if a.activations is not None and b.activations is not None:
        sections.append(
            (
                "activations",
                {r.fqn: r.propagated for r in a.activations.rows},
                {r.fqn: r.propagated for r in b.activations.rows},
            )
        )
        sections.append(
            (
                "activations (local)",
                {r.fqn: r.local for r in a.activations.rows},
                {r.fqn: r.local for r in b.activations.rows},
            )
        )
    for section, before, after in sections:
        for fqn, values in before.items():
            now = {v.name: v.value for v in after.get(fqn, ())}
            changes.extend(
                MetricChange(section=section, fqn=fqn, metric=v.name, before=v.value, after=now[v.name])
                for v in values
                if v.name in now and numbers_differ(v.value, now[v.name], rel_tol, abs_tol)
            )
    return changes


def diff_reports(a: Report, b: Report, *, rel_tol: float = 0.05, abs_tol: float = 1e-6) -> ReportDiff:
    """How ``b`` differs from ``a``: findings, verdicts, suggestions and measured numbers.

    Args:
        a: the report before.
        b: the report after.
        rel_tol: a number counts as moved beyond this relative change.
        abs_tol: and beyond this absolute one (numbers near zero).

    Returns:
        The :class:`ReportDiff`, every difference typed.
    """
    sites_a, sites_b = [s.fqn for s in a.sites], [s.fqn for s in b.sites]
    detectors_a, detectors_b = [r.detector for r in a.results], [r.detector for r in b.results]
    verdicts, numbers = _finding_changes(a, b, rel_tol, abs_tol)
    suggested_b = {s.fqn: s.describe() for s in b.suggestions}
    suggestions = [
        SuggestionChange(fqn=s.fqn, before=s.describe(), after=suggested_b[s.fqn])
        for s in a.suggestions
        if s.fqn in suggested_b and suggested_b[s.fqn] != s.describe()
    ]
    return ReportDiff(
        modules_added=tuple(f for f in sites_b if f not in sites_a),
        modules_removed=tuple(f for f in sites_a if f not in sites_b),
        detectors_added=tuple(d for d in detectors_b if d not in detectors_a),
        detectors_removed=tuple(d for d in detectors_a if d not in detectors_b),
        verdicts=tuple(verdicts),
        numbers=tuple(numbers),
        suggestions=tuple(suggestions),
        metrics=tuple(_metric_changes(a.comparison, b.comparison, rel_tol, abs_tol)),
        fields=tuple(FieldChange(path=p, before=x, after=y) for p, x, y in field_changes(a, b, rel_tol, abs_tol)),
    )
