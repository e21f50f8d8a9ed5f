"""Plots of a report's features (the only module that imports matplotlib).

Figures are built with matplotlib's object API, never pyplot: nothing global
changes and no display is needed. Each function returns a ``Figure``
(``fig.savefig(path)`` writes it). Non-finite values are left out and counted
in the title; an empty selection gives a figure that says what is missing.
Modules with different channel counts are fine: channels are plotted per module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from qinsight.core.comparison import ActivationComparison
from qinsight.core.plan import QuantPlan, Target
from qinsight.outputs.view import ReportView


def _finite(values: Sequence[float | None]) -> tuple[list[int], list[float], int]:
    """Indices and values of the finite entries, and how many were left out."""
    kept = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    return [i for i, _ in kept], [v for _, v in kept], len(values) - len(kept)


def _empty(title: str, reason: str) -> Figure:
    figure = Figure(figsize=(6, 2.5))
    axes = figure.add_subplot()
    axes.set_title(_plain(title))
    axes.text(0.5, 0.5, _plain(reason), ha="center", va="center", transform=axes.transAxes)
    axes.set_axis_off()
    return figure


def _plain(text: str) -> str:
    """``text`` shown as written: matplotlib reads ``$...$`` as math, and a module name like ``$\\frac{a$``
    made the whole page fail."""
    return text.replace("$", r"\$")


def _title(name: str, left_out: int) -> str:
    return _plain(name + (f" ({left_out} non-finite values not shown)" if left_out else ""))


def plot_feature(view: ReportView, feature: str) -> Figure:
    """One line across modules in forward order; a per-channel feature is shown by its channel maximum."""
    rows = [row for row in view.rows if row.feature(feature) is not None]
    if not rows:
        return _empty(feature, f"no module has the feature {feature!r}")
    values: list[float | None] = []
    per_channel = False
    for row in rows:
        found = row.feature(feature)
        if found is not None and found.channels is not None:
            per_channel = True
            finite = [v for v in found.channels if math.isfinite(v)]
            values.append(max(finite) if finite else None)
        else:
            values.append(None if found is None else found.value)
    index, kept, left_out = _finite(values)
    figure = Figure(figsize=(max(6.0, 0.35 * len(rows)), 3.5), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(index, kept, marker="o", label=f"max over channels of {feature}" if per_channel else feature)
    axes.set_xticks(range(len(rows)), [_plain(row.fqn) for row in rows], rotation=60, ha="right", fontsize=7)
    axes.set_xlabel("module (forward order)")
    axes.set_ylabel(f"{feature} (channel max)" if per_channel else feature)
    axes.set_title(_title(feature, left_out))
    return figure


def plot_channels(view: ReportView, module: str, feature: str) -> Figure:
    """A per-channel feature of one module, channel by channel."""
    row = view.row(module)
    found = row.feature(feature)
    if found is None or found.channels is None:
        return _empty(f"{module}: {feature}", f"{module} has no per-channel feature {feature!r}")
    index, kept, left_out = _finite(found.channels)
    figure = Figure(figsize=(6, 3.5), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(index, kept, marker=".", linestyle="-", label=feature)
    axes.set_xlabel("channel")
    axes.set_ylabel(feature)
    axes.set_title(_title(f"{module}: {feature}", left_out))
    return figure


def plot_histogram(view: ReportView, feature: str, module: str | None = None, bins: int = 30) -> Figure:
    """The distribution of a feature: over channels of one module, or over all modules' values."""
    rows = view.rows if module is None else (view.row(module),)
    values: list[float | None] = []
    for row in rows:
        found = row.feature(feature)
        if found is not None:
            values.extend(found.channels if found.channels is not None else (found.value,))
    _, kept, left_out = _finite(values)
    where = module or "all modules"
    if not kept:
        return _empty(f"{feature} ({where})", f"no finite values of {feature!r} in {where}")
    figure = Figure(figsize=(6, 3.5), layout="constrained")
    axes = figure.add_subplot()
    axes.hist(kept, bins=bins)
    axes.set_xlabel(feature)
    axes.set_ylabel("count")
    axes.set_title(_title(f"{feature} ({where})", left_out))
    return figure


def plot_sqnr(activations: ActivationComparison) -> Figure:
    """Local and propagated SQNR per layer in forward order: where error is made, and where it piles up."""
    layers = activations.layers
    if not layers:
        return _empty("SQNR per layer", "no layers were compared")
    figure = Figure(figsize=(max(6.0, 0.35 * len(layers)), 3.5), layout="constrained")
    axes = figure.add_subplot()
    left_out = 0
    for local, label in ((True, "local (error this layer makes)"), (False, "propagated (error so far)")):
        index, kept, dropped = _finite([layer.metric("sqnr", local=local) for layer in layers])
        left_out += dropped
        axes.plot(index, kept, marker="o", label=label)
    axes.set_xticks(range(len(layers)), [_plain(layer.fqn) for layer in layers], rotation=60, ha="right", fontsize=7)
    axes.set_xlabel("layer (forward order)")
    axes.set_ylabel("SQNR (dB)")
    axes.legend(fontsize=8)
    axes.set_title(_title("float vs quantized, SQNR per layer", left_out))
    return figure


def _focus(axes: Any, scores: list[float]) -> None:
    """The score axis over the quantized points and the target: the all-float start (an SQNR of hundreds
    of dB, or infinite) would flatten the region that matters, so it is left above the axis, said so."""
    finite = [score for score in scores if math.isfinite(score)]
    if not finite:
        return
    low, high = min(finite), max(finite)
    pad = max((high - low) * 0.1, 1e-3 * max(abs(high), 1.0))
    top = axes.get_ylim()[1]
    if top > high + 4 * pad:
        axes.set_ylim(low - pad, high + pad)
        axes.annotate(
            "all float: above the axis", xy=(0.01, 0.97), xycoords="axes fraction", fontsize=7, va="top", color="gray"
        )


def plot_plan(plan: QuantPlan) -> Figure:
    """The search: the score of each prefix of the sites in the plan's order against the fraction of
    parameters it quantizes (the curve), and the sites tried one by one after the chosen prefix."""
    if not plan.steps:
        return _empty("plan", "the plan has no search steps")
    figure = Figure(figsize=(6, 3.5), layout="constrained")
    axes = figure.add_subplot()
    curve = [(s.quantized_fraction, s.score) for s in plan.steps if s.stage in ("start", "curve", "budget")]
    axes.plot(*zip(*curve), marker="o", markersize=3, label="quantized in order (each prefix)")
    before = 0.0
    kept: list[tuple[float, float]] = []
    missed: list[tuple[float, float]] = []
    settled: list[tuple[float, float]] = []  # stopped once the miss was certain: the score at most that
    for step in plan.steps:
        if step.stage == "refine":
            into = kept if step.kept else settled if step.settled_after else missed
            into.append((step.quantized_fraction if step.kept else before, step.score))
        if step.kept:
            before = step.quantized_fraction
    if kept:
        axes.plot(*zip(*kept), "o", color="tab:green", markersize=4, label="tried after the prefix: kept")
    if missed:
        axes.plot(*zip(*missed), "x", color="tab:red", label="tried after the prefix: missed, kept in float")
    if settled:
        said = "missed on its first batches (at most), kept in float"
        axes.plot(*zip(*settled), "v", color="tab:red", markersize=4, label=f"tried after the prefix: {said}")
    threshold = [plan.target.threshold] if isinstance(plan.target, Target) else []  # a budget has none
    for line in threshold:
        axes.axhline(line, color="gray", linestyle="--", label=f"target {plan.target}")
    _focus(
        axes,
        [score for fraction, score in curve if fraction > 0]
        + [s.score for s in plan.steps if s.stage == "refine"]
        + threshold,
    )
    axes.set_xlabel("fraction of layer parameters quantized")
    axes.set_ylabel(f"{plan.metric} (simulated)")
    axes.legend(fontsize=8)
    axes.set_title(_plain(f"plan ({plan.flow}): {plan.metric} as sites are quantized"))
    return figure
