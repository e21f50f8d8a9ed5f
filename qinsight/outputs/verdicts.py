"""A report's verification (:mod:`qinsight.core.verification`) as lines for the text and the page:
per flow, the config's score for real beside the flow's default, and each kind of suggestion dropped
with its numbers; or that the config was not verified."""

from __future__ import annotations

from qinsight.core.flows import flow_spec, reads_as_is, verifying_flows
from qinsight.core.report import Report
from qinsight.core.verification import ConfigVerification, SuggestionKind

UNVERIFIED = (
    "Not verified: this config was not quantized and scored for real (diagnose(verify=False) or QINSIGHT_VERIFY=0, "
    "or a distributed run); qinsight.verify_report(model, report, data) verifies it"
)


def verification_lines(report: Report) -> list[str]:
    """The verdict of each flow the report's config was verified in, and what it dropped; or that the
    attached plan verified its own; or :data:`UNVERIFIED`."""
    if not report.verification and report.plan is not None:
        return [
            f"Verified by the plan in {report.plan.flow}: its config, quantized for real against {report.plan.target} "
            "(below)"
        ]
    if not report.verification and not reads_as_is(report.metadata.frontend):
        flows = verifying_flows(report.metadata.frontend, report.metadata.backend)
        return [
            f"Not verified (verify=False or QINSIGHT_VERIFY=0): FX cannot trace this model (the eager frontend "
            f"read it), so {' and '.join(flow_spec(f).title for f in flows)} verify it: "
            f"qinsight.verify_report(model, report, data) quantizes {flow_spec(flows[0]).call('report')} for real"
        ]
    if not report.verification:
        return [UNVERIFIED]
    calls = " / ".join(flow_spec(verdict.flow).call("report") for verdict in report.verification)
    lines = [f"Verified for real ({calls} leave{'s' if len(report.verification) == 1 else ''} out what was dropped):"]
    for verdict in report.verification:
        lines.append(f"  {verdict.describe()}")
        lines.extend(
            f"    {check.kind.value} ({check.modules} module{'s' if check.modules != 1 else ''}): {check.reason}"
            for check in verdict.checks
            if not check.kept
        )
        lines.extend(f"    {note}" for note in verdict.notes)
        lines.extend(_corrected_biases(verdict))
    return lines


def _corrected_biases(verdict: ConfigVerification, shown: int = 3) -> list[str]:
    """The biases the offered config corrects: how many, the largest by size."""
    applied = verdict.applied_bias_correction
    if not applied.entries:
        return []
    largest = "; ".join(entry.describe() for entry in applied.largest(shown))
    without = next(c.without for c in verdict.checks if c.kind is SuggestionKind.BIAS_CORRECTION)
    return [f"    biases corrected in {len(applied)} layers ({without:.1f} dB without); largest: {largest}"]


__all__ = ["UNVERIFIED", "verification_lines"]
