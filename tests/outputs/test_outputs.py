"""The module-major view, plots (checked by content), and the HTML page (parsed, and rendered by Chromium)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import attrs
import pytest
from _data import gaussian_batches
from _models import MLP, seeded

import qinsight
from qinsight.examples import example
from qinsight.outputs.html import config_code, render_html
from qinsight.outputs.plots import plot_channels, plot_feature, plot_histogram
from qinsight.outputs.view import ReportView


@pytest.fixture(scope="module")
def report() -> qinsight.Report:
    chosen = example("resnet18")
    return qinsight.diagnose(
        chosen.model(), chosen.data(2), model_name="resnet18", verify=False
    )  # the outputs, not the config


@pytest.mark.slow
def test_view_is_module_major_and_filterable(report: qinsight.Report) -> None:
    view = ReportView.of(report)
    assert [row.fqn for row in view.rows] == [site.fqn for site in report.sites]
    row = view.row("blocks.4.conv1")
    # every detector that judges convs; precision and range conflict judge Linears and the ops between
    assert {d for d, _ in row.verdicts} == {r.detector for r in report.results} - {
        "qinsight.precision",
        "qinsight.range_conflict",
    }
    add = view.row(next(s.fqn for s in report.sites if s.kind is qinsight.types.OpKind.ADD))
    assert {d for d, _ in add.verdicts} == {"qinsight.precision", "qinsight.range_conflict"}
    ratios = row.feature("outliers.ratios")
    assert ratios is not None and ratios.per_channel and len(ratios.channels or ()) == 128
    assert row.feature("dynamic_static.output.statistic") is not None
    narrowed = view.filter(modules=["fc", "stem.0"], features=["outliers.ratios"])
    assert [r.fqn for r in narrowed.rows] == ["stem.0", "fc"] and narrowed.feature_names() == ("outliers.ratios",)
    assert view.filter(modules=["nothing"]).rows == ()
    assert "outliers.ratios" in view.plottable() and "outliers.ratios" in view.feature_names()
    with pytest.raises(KeyError, match="no module 'nope'"):
        view.row("nope")


def test_line_plot_across_modules(report: qinsight.Report) -> None:
    figure = plot_feature(ReportView.of(report), "outliers.ratios")
    (axes,) = figure.axes
    (line,) = axes.get_lines()
    layers = [s.fqn for s in report.sites if s.kind.is_layer]  # the outlier detector judges layers
    assert [t.get_text() for t in axes.get_xticklabels()] == layers
    assert len(line.get_xdata()) == len(layers)
    assert axes.get_ylabel() == "outliers.ratios (channel max)"


def test_channel_plot_masks_non_finite_values(report: qinsight.Report) -> None:
    view = ReportView.of(report)
    ratios = view.row("blocks.4.conv1").feature("outliers.ratios")
    assert ratios is not None and ratios.channels is not None
    missing = sum(not math.isfinite(v) for v in ratios.channels)
    assert missing > 0  # sparse channels behind ReLUs have no ratio
    figure = plot_channels(view, "blocks.4.conv1", "outliers.ratios")
    (axes,) = figure.axes
    assert len(axes.get_lines()[0].get_xdata()) == len(ratios.channels) - missing
    assert f"({missing} non-finite values not shown)" in axes.get_title()
    # modules of different channel counts plot alike (torch's table crashes on them)
    assert len(plot_channels(view, "fc", "outliers.ratios").axes[0].get_lines()[0].get_xdata()) <= 512


def test_histogram_and_empty_selections(report: qinsight.Report) -> None:
    view = ReportView.of(report)
    figure = plot_histogram(view, "equalization.scores", module="fc")
    (axes,) = figure.axes
    assert sum(patch.get_height() for patch in axes.patches) == sum(
        math.isfinite(v)
        for v in (view.row("fc").feature("equalization.scores").channels or ())  # type: ignore[union-attr]
    )
    empty = plot_feature(view, "no.such.feature")
    assert "no module has the feature" in empty.axes[0].texts[0].get_text()
    empty = plot_channels(view, "fc", "dynamic_static.input.statistic")  # a scalar, not per channel
    assert "no per-channel feature" in empty.axes[0].texts[0].get_text()


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attributes: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attributes)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    return parser


def test_html_page_is_complete_and_self_contained(report: qinsight.Report) -> None:
    named = attrs.evolve(report, metadata=attrs.evolve(report.metadata, model="<script>alert(1)</script>"))
    page = render_html(named)
    parsed = parse(page)
    headings = [t for t in parsed.text if t in ("Suggested config", "Modules", "Plots", "Detail", "Failures")]
    assert headings == ["Suggested config", "Modules", "Plots", "Detail", "Failures"]
    assert ("script", {}) not in parsed.tags and "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # escaped
    sources = [a.get("src") or a.get("href") or "" for _, a in parsed.tags]
    assert not [s for s in sources if s and not s.startswith("data:image/png;base64,")]  # nothing fetched
    rows = [t for t, _ in parsed.tags if t == "tr"]
    assert len(rows) == 2 + 1 + len(report.sites)  # summary (2) + verdict header + one per module
    assert sum(1 for t, _ in parsed.tags if t == "details") == len(report.sites)
    assert sum(1 for t, _ in parsed.tags if t == "img") >= 4


def test_config_code_builds_the_reports_mapping(report: qinsight.Report) -> None:
    namespace: dict[str, object] = {}
    exec(config_code(report), namespace)  # the code a user pastes
    pasted, generated = namespace["mapping"], qinsight.qconfig_mapping(report)
    for table in ("module_name_qconfigs", "module_name_object_type_order_qconfigs", "object_type_qconfigs"):
        mine, theirs = getattr(pasted, table), getattr(generated, table)
        assert mine.keys() == theirs.keys()
        for key, qconfig in theirs.items():
            if qconfig is None:
                assert mine[key] is None
                continue
            assert type(mine[key].activation()) is type(qconfig.activation())
            weight = mine[key].weight()
            assert type(weight) is type(qconfig.weight()) and getattr(weight, "qscheme", None) == getattr(
                qconfig.weight(), "qscheme", None
            )


def test_failures_are_shown() -> None:
    report = qinsight.diagnose(
        seeded(MLP()), gaussian_batches((4, 16), 2), detectors=["qinsight.outliers", "acme.missing"]
    )
    page = render_html(report)
    assert 'class="fail"' in page and "acme.missing failed at load" in page


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


@pytest.mark.slow
def test_page_renders_in_chromium(report: qinsight.Report, tmp_path: Path) -> None:
    browser = shutil.which("chromium")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs Chromium (apt-get install chromium) for this test")
        pytest.skip("apt-get install chromium")
    page, shot = tmp_path / "report.html", tmp_path / "report.png"
    page.write_text(render_html(report))
    with tempfile.TemporaryDirectory() as profile:
        run = subprocess.run(
            [
                browser,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={shot}",
                "--window-size=1280,2400",
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []  # no script errors, no failed loads reported by the page
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1280, 2400)
        colors = image.convert("L").getcolors(maxcolors=1_000_000) or []
        assert len(colors) > 50  # text, tables and plots, not a blank page
