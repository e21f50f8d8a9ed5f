"""One self-contained HTML page per report: no network, plots embedded as PNG.

Sections: summary, the suggested config as code to paste, a modules ×
detectors table of verdicts, plots of the key features, per-module detail,
what failed, and the float-vs-quantized comparison when the report carries
one. Every text from the report is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Iterable

from qinsight.core.advice import advice_of
from qinsight.core.flows import flow_spec, reads_as_is, report_flow
from qinsight.core.report import Report
from qinsight.outputs.files import write_atomically
from qinsight.outputs.format_plans import format_summary, format_tables
from qinsight.outputs.plans import plan_tables, summary_lines
from qinsight.outputs.tables import Table, comparison_tables
from qinsight.outputs.verdicts import verification_lines
from qinsight.outputs.view import ReportView

KEY_FEATURES = (
    "dynamic_static.output.statistic",
    "equalization.scores",
    "outliers.ratios",
    "outliers.channel_abs_max",
)
MAX_DETAIL_PLOTS = 12  # per-channel plots, for the first actionable modules

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
td.act{background:#ffe8c2}pre{background:#f5f5f5;padding:1em;overflow-x:auto;font-size:.85em}
img{max-width:100%}details{margin:.3em 0}.fail{color:#a00}
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _png(figure: object) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)  # type: ignore[attr-defined]
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _suggested_config(report: Report) -> str:
    """FX's pasteable config where FX serves the report's backend and reads its model; else the call that
    builds the config of the flow that does."""
    backend, frontend = report.metadata.backend, report.metadata.frontend
    if not flow_spec("fx").serves(backend) or not reads_as_is(frontend):
        spec = flow_spec(report_flow(frontend, backend))
        call = _e(spec.call("report"))
        why = f"{_e(backend)} quantizes" if reads_as_is(frontend) else "FX cannot trace this model; it quantizes"
        return f"<p>{why} through {spec.title}: <code>{call}</code> gives the config.</p>"
    source = " It is the attached plan's config, verified below." if advice_of(report, "fx").source == "plan" else ""
    return f"""<p>Paste to quantize with <code>prepare_fx(model, mapping, example_inputs)</code>, or use
<code>qinsight.qconfig_mapping(report)</code> / <code>qinsight.pt2e_quantizer(report)</code>.{source}</p>
<pre id="config">{_e(config_code(report))}</pre>"""


def config_code(report: Report) -> str:
    """Python that builds the same QConfigMapping as ``qinsight.qconfig_mapping(report)`` (and the
    equalization config, where the report equalizes)."""
    from qinsight import apply  # torch, only when the page shows the code

    return "\n".join(apply.config_code(report)) + "\n"


def _refused_equalizations(report: Report) -> str:
    refused = report.equalization_mapping.refused
    if not refused:
        return ""
    items = "".join(f"<li><code>{_e(r.fqn)}</code>: {_e(r.reason)}</li>" for r in refused)
    return f"<p>Suggested but not equalized: torch cannot apply these as they are.</p><ul>{items}</ul>"


def _verification(report: Report) -> str:
    """Whether the config above was verified for real, per flow, and what it dropped."""
    first, *rest = verification_lines(report)
    items = "".join(f"<li>{_e(line.strip())}</li>" for line in rest)
    return f'<p id="verification">{_e(first)}</p>' + (f"<ul>{items}</ul>" if items else "")


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(f"<tr>{''.join(rows_cells)}</tr>" for rows_cells in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _verdict_table(report: Report) -> str:
    detectors = [r.detector for r in report.results]
    findings = {(r.detector, f.fqn): f for r in report.results for f in r.findings}
    rows = []
    for site in report.sites:
        cells = [f"<td>{_e(site.fqn)}</td>", f"<td>{_e(site.kind.value)}</td>"]
        for detector in detectors:
            finding = findings.get((detector, site.fqn))
            if finding is None:
                cells.append("<td></td>")
            else:
                css = ' class="act"' if finding.actionable else ""
                cells.append(f'<td{css} title="{_e(finding.reason())}">{_e(finding.verdict)}</td>')
        rows.append(cells)
    return _table(["module", "kind", *detectors], rows)


def _details(report: Report, view: ReportView) -> str:
    from qinsight.outputs.plots import plot_channels

    parts = []
    plots_left = MAX_DETAIL_PLOTS
    for site in report.sites:
        findings = [(r.detector, f) for r in report.results for f in r.findings if f.fqn == site.fqn]
        actionable = [f for _, f in findings if f.actionable]
        lines = "".join(
            f"<li{' class=act' if f.actionable else ''}><b>{_e(d)}</b>: {_e(f.verdict)}: {_e(f.reason())}</li>"
            for d, f in findings
        )
        plot = ""
        if actionable and plots_left > 0:
            row = view.row(site.fqn)
            for feature in ("outliers.ratios", "equalization.scores"):
                if row.feature(feature) is not None:
                    plot += _png(plot_channels(view, site.fqn, feature))
            plots_left -= 1
        mark = f" ({len(actionable)} to act on)" if actionable else ""
        parts.append(f"<details><summary>{_e(site.fqn)}{_e(mark)}</summary><ul>{lines}</ul>{plot}</details>")
    return "".join(parts)


def _titled_tables(tables: list[Table]) -> list[str]:
    parts = []
    for table in tables:
        parts.append(f"<h3>{_e(table.title)}</h3>")
        parts.append(_table(table.header, ([f"<td>{_e(cell)}</td>" for cell in row] for row in table.rows)))
        if table.note:
            parts.append(f"<p>{_e(table.note)}</p>")
    return parts


def _comparison(report: Report) -> str:
    from qinsight.outputs.plots import plot_sqnr

    if report.comparison is None:
        return ""
    quantized = report.comparison.quantized
    parts = [f"<h2>Float vs quantized{_e(' (' + quantized + ')' if quantized else '')}</h2>"]
    if report.comparison.activations is not None:
        parts.append(_png(plot_sqnr(report.comparison.activations)))
    parts.extend(_titled_tables(comparison_tables(report.comparison)))
    return "\n".join(parts)


def _plan(report: Report) -> str:
    """A plan's verdict, first on the page: what it reached for real beside the default, its curve, and
    its config where the suggested config below is not it (a PT2E plan)."""
    from qinsight import apply  # torch, only when the page shows a plan
    from qinsight.outputs.plots import plot_plan

    if report.plan is None:
        return ""
    lines = summary_lines(report.plan)  # the headline (a slower program's line before it), then its details
    details = [line for line in lines if line.startswith("  ")]
    parts = [f"<h2>Plan: {_e(report.plan.target)} ({_e(report.plan.flow)})</h2>"]
    parts += [f"<p>{_e(line)}</p>" for line in lines if not line.startswith("  ")]
    parts.append("<ul>" + "".join(f"<li>{_e(line.strip())}</li>" for line in details) + "</ul>")
    parts.append(_png(plot_plan(report.plan)))
    plan = report.plan
    if not flow_spec(
        plan.flow
    ).observes_activations:  # an FX plan's config is the page's suggested config, shown once below
        code = (
            apply.config_code(plan) if flow_spec("fx").serves(plan.backend) else [flow_spec(plan.flow).call("report")]
        )
        parts.append(f"<pre>{_e(chr(10).join(code))}</pre>")
    return "\n".join(parts)


def _plan_detail(report: Report) -> str:
    """A plan's tables (checks, sensitivities, the search), after the diagnosis."""
    if report.plan is None:
        return ""
    return "\n".join([f"<h2>Plan detail ({_e(report.plan.flow)})</h2>", *_titled_tables(plan_tables(report.plan))])


def _formats(report: Report) -> str:
    """A format plan, first on the page: its verdict, the uniform formats beside it, then its tables."""
    if report.formats is None:
        return ""
    summary, *details = format_summary(report.formats)
    parts = ["<h2>Format plan (torchao quantize_)</h2>", f"<p>{_e(summary)}</p>"]
    parts.append("<ul>" + "".join(f"<li>{_e(line.strip())}</li>" for line in details) + "</ul>")
    parts.extend(_titled_tables(format_tables(report.formats)))
    return "\n".join(parts)


def render_html(report: Report) -> str:
    from qinsight.outputs.plots import plot_feature

    meta = report.metadata
    view = ReportView.of(report)
    actionable = report.actionable()
    summary = _table(
        ["model", "frontend", "backend", "batches", "modules", "to act on", "qinsight", "torch"],
        [
            [
                f"<td>{_e(v)}</td>"
                for v in (
                    meta.model,
                    meta.frontend,
                    meta.backend,
                    meta.batches,
                    len(report.sites),
                    len(actionable),
                    meta.qinsight_version,
                    meta.torch_version,
                )
            ]
        ],
    )
    plots = "".join(_png(plot_feature(view, feature)) for feature in KEY_FEATURES if feature in view.feature_names())
    failures = "".join(
        f'<li class="fail">{_e(f.detector)} failed at {_e(f.stage.value)}: {_e(f.error)}</li>' for f in report.failures
    )
    diagnosis = f"""<h2>Suggested config</h2>
{_suggested_config(report)}
{_verification(report)}
{_refused_equalizations(report)}
<h2>Modules</h2>
{_verdict_table(report)}
<h2>Plots</h2>
{plots or "<p>No plottable features.</p>"}
<h2>Detail</h2>
{_details(report, view)}
<h2>Failures</h2>
{f"<ul>{failures}</ul>" if failures else "<p>None.</p>"}"""
    if not report.sites and report.comparison is not None:  # a file holding a comparison only
        diagnosis = ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>qinsight report: {_e(meta.model)}</title>
<style>{_STYLE}</style></head><body>
<h1>qinsight report: {_e(meta.model)}</h1>
{summary}
{_formats(report)}
{_plan(report)}
{diagnosis}
{_comparison(report)}
{_plan_detail(report)}
</body></html>
"""


def save_html(report: Report, path: str | os.PathLike[str]) -> None:
    """Write the page; rendered whole first, so a render error leaves ``path`` as it was."""
    write_atomically(path, render_html(report))
