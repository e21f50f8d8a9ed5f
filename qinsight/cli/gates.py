"""``--fail-on``: gates a CI can trust.

A gate value must be something that can happen: a verdict one of the
detectors declares (``Finding.verdicts``), ``actionable``, or for ``diff`` one
of its gate forms. A typo is a usage error listing the valid values, not a
gate that never trips.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from qinsight.core.errors import UsageError
from qinsight.core.findings import Finding
from qinsight.core.report import Report
from qinsight.outputs.diff import ReportDiff
from qinsight.plugin.discovery import finding_type

ACTIONABLE = "actionable"  # --fail-on value matching every finding that asks for action
UNVERIFIED = "unverified"  # --fail-on value: the report's config was not verified for real in some flow (or in none)
DIFF_GATES = ("any", "verdict", "actionable", "sqnr-drop=DB")


def declared_verdicts(detector_ids: Iterable[str]) -> tuple[set[str], list[str]]:
    """The verdicts the detectors declare, and the detectors that declare none (or are not installed)."""
    verdicts: set[str] = set()
    undeclared: list[str] = []
    for detector in detector_ids:
        found = finding_type(detector)
        if found is None or not found.verdicts:
            undeclared.append(detector)
        else:
            verdicts.update(found.verdicts)
    return verdicts, undeclared


def check_verdict_gates(gates: Sequence[str], detector_ids: Iterable[str]) -> list[str]:
    """Raise on a gate no detector can trip; returns notes for detectors whose verdicts are unknown."""
    if not gates:
        return []
    verdicts, undeclared = declared_verdicts(detector_ids)
    unknown = [g for g in gates if g not in (ACTIONABLE, UNVERIFIED) and g not in verdicts]
    if unknown and not undeclared:
        valid = ", ".join(repr(v) for v in [ACTIONABLE, UNVERIFIED, *sorted(verdicts)])
        raise UsageError(f"--fail-on {unknown[0]!r} is no verdict of these detectors; valid: {valid}")
    return [f"--fail-on {g!r} is not checked against {', '.join(undeclared)} (no declared verdicts)" for g in unknown]


def tripped_findings(report: Report, gates: Sequence[str]) -> list[tuple[str, Finding]]:
    return [
        (result.detector, finding)
        for result in report.results
        for finding in result.findings
        if finding.verdict in gates or (ACTIONABLE in gates and finding.actionable)
    ]


def unverified(report: Report, gates: Sequence[str]) -> list[str]:
    """With the ``unverified`` gate: why the report's config is not verified, a line per flow (one line
    where it was verified in none)."""
    if UNVERIFIED not in gates:
        return []
    if not report.verification:
        return ["the report's config was verified in no flow"]
    return [verdict.describe() for verdict in report.verification if not verdict.verified]


@attrs.frozen
class DiffGates:
    any: bool = False
    verdict: bool = False
    actionable: bool = False
    sqnr_drop: float | None = None


def parse_diff_gates(values: Sequence[str]) -> DiffGates:
    gates = DiffGates()
    for value in values:
        name, _, number = value.partition("=")
        if name in ("any", "verdict", "actionable") and not number:
            gates = attrs.evolve(gates, **{name: True})
        elif name == "sqnr-drop" and number:
            try:
                drop = float(number)
            except ValueError:
                drop = math.nan
            if not math.isfinite(drop) or drop < 0:
                raise UsageError(f"--fail-on {value!r}: the drop must be a number of dB >= 0")
            gates = attrs.evolve(gates, sqnr_drop=drop)
        else:
            raise UsageError(f"--fail-on {value!r} is no diff gate; valid: {', '.join(DIFF_GATES)}")
    return gates


def tripped_diff(diff: ReportDiff, gates: DiffGates) -> list[str]:
    """One line per reason the diff trips a gate."""
    lines: list[str] = []
    if gates.any and not diff.empty:
        lines.append("the reports differ")
    if gates.verdict:
        lines.extend(f"{v.detector} {v.fqn}: {v.before} -> {v.after}" for v in diff.verdicts)
    if gates.actionable:
        lines.extend(
            f"{v.detector} {v.fqn} became actionable: {v.after}"
            for v in diff.verdicts
            if v.actionable_after and not v.actionable_before
        )
    if gates.sqnr_drop is not None:
        lines.extend(
            f"{m.section} {m.fqn}: SQNR fell {drop:.1f} dB ({m.before:.1f} -> {m.after:.1f})"
            for m, drop in diff.sqnr_drops()
            if drop > gates.sqnr_drop
        )
    return lines
