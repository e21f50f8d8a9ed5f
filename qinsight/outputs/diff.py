"""What changed between two reports: a typed diff for review.

Modules added or removed, detectors added or removed, verdicts that changed,
suggestions that changed, and numbers that moved beyond a tolerance. Numbers
are the scalar fields of findings of the same class (nested ones by dotted
name, ``input.statistic``); per-channel tuples are summarized by the verdicts
they lead to, not diffed element by element.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import cast

import attrs

from qinsight.core.findings import Finding
from qinsight.core.report import Report


@attrs.frozen(kw_only=True)
class VerdictChange:
    detector: str
    fqn: str
    before: str
    after: str


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
class ReportDiff:
    modules_added: tuple[str, ...] = ()
    modules_removed: tuple[str, ...] = ()
    detectors_added: tuple[str, ...] = ()
    detectors_removed: tuple[str, ...] = ()
    verdicts: tuple[VerdictChange, ...] = ()
    numbers: tuple[NumberChange, ...] = ()
    suggestions: tuple[SuggestionChange, ...] = ()

    @property
    def empty(self) -> bool:
        return not any(attrs.astuple(self, recurse=False))

    def to_text(self) -> str:
        if self.empty:
            return "no differences\n"
        lines = [f"{label}: {', '.join(items)}" for label, items in (
            ("modules added", self.modules_added),
            ("modules removed", self.modules_removed),
            ("detectors added", self.detectors_added),
            ("detectors removed", self.detectors_removed),
        ) if items]
        lines += [f"{v.detector} {v.fqn}: {v.before} -> {v.after}" for v in self.verdicts]
        lines += [f"suggestion {s.fqn}: {s.before} -> {s.after}" for s in self.suggestions]
        lines += [f"{n.detector} {n.fqn}.{n.field}: {n.before:.4g} -> {n.after:.4g}" for n in self.numbers]
        return "\n".join(lines) + "\n"


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


def _moved(before: float, after: float, rel_tol: float, abs_tol: float) -> bool:
    if math.isnan(before) or math.isnan(after):
        return math.isnan(before) != math.isnan(after)
    return not math.isclose(before, after, rel_tol=rel_tol, abs_tol=abs_tol)


def _findings(report: Report) -> dict[tuple[str, str], Finding]:
    return {(r.detector, f.fqn): f for r in report.results for f in r.findings}


def diff_reports(a: Report, b: Report, *, rel_tol: float = 0.05, abs_tol: float = 1e-6) -> ReportDiff:
    """How ``b`` differs from ``a``; numbers count as moved beyond ``rel_tol`` (and ``abs_tol``)."""
    sites_a, sites_b = [s.fqn for s in a.sites], [s.fqn for s in b.sites]
    detectors_a, detectors_b = [r.detector for r in a.results], [r.detector for r in b.results]
    findings_a, findings_b = _findings(a), _findings(b)
    verdicts: list[VerdictChange] = []
    numbers: list[NumberChange] = []
    for key, before in findings_a.items():
        after = findings_b.get(key)
        if after is None:
            continue
        detector, fqn = key
        if before.verdict != after.verdict:
            verdicts.append(VerdictChange(detector=detector, fqn=fqn, before=before.verdict, after=after.verdict))
        if type(before) is type(after):
            new_values = dict(_scalars(after))
            numbers.extend(
                NumberChange(detector=detector, fqn=fqn, field=name, before=old, after=new_values[name])
                for name, old in _scalars(before)
                if name in new_values and _moved(old, new_values[name], rel_tol, abs_tol)
            )
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
    )
