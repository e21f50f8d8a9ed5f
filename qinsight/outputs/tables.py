"""A comparison as titled tables of strings, which the text and the HTML outputs lay out.

Layers are listed worst first (lowest SQNR where the error is made), so the
top of each table is where to look; ``limit`` keeps long models short.
"""

from __future__ import annotations

import math
from collections import Counter

import attrs

from qinsight.core.comparison import (
    ActivationComparison,
    Comparison,
    ConfigComparison,
    MetricValue,
    WeightComparison,
)

DEFAULT_LIMIT = 10


@attrs.frozen
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def _db(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def _value(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else _db(value)


def _ratio(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "inf"


def _more(total: int, shown: int, rows: str = "layers") -> str:
    return f"{total - shown} more {rows} in the file" if total > shown else ""


def weight_table(weights: WeightComparison, limit: int = DEFAULT_LIMIT) -> Table:
    layers = weights.worst("sqnr", count=None)
    rows = tuple(
        (layer.fqn, layer.kind, _db(layer.metric("sqnr")), layer.folded_bn or "", "" if layer.quantized else "yes")
        for layer in layers[:limit]
    )
    return Table("Weights, worst first (SQNR dB)", ("layer", "kind", "sqnr", "bn folded", "left in float"), rows, _more(len(layers), len(rows)))


def activation_table(activations: ActivationComparison, limit: int = DEFAULT_LIMIT) -> Table:
    """Local SQNR is the error the layer makes; propagated / local error > 1 means it amplifies what arrives."""
    layers = activations.worst("sqnr", local=True, count=None)
    rows = tuple(
        (
            layer.fqn,
            layer.compared_at if layer.compared_at != layer.fqn else "",
            _db(layer.metric("sqnr", local=True)),
            _db(layer.metric("sqnr")),
            _ratio(layer.error_ratio),
        )
        for layer in layers[:limit]
    )
    return Table(
        "Activations, worst local SQNR first (dB)",
        ("layer or op", "compared at", "local", "propagated", "error ratio"),
        rows,
        _more(len(layers), len(rows), "layers and ops" if activations.ops else "layers"),
    )


def config_table(configs: ConfigComparison, limit: int = DEFAULT_LIMIT) -> Table:
    """Local ``rank_by`` per layer and config, the layers where the best config wins by most first."""

    def margin(row_scores: dict[str, MetricValue]) -> float:
        """How much the best config beats the runner-up by."""
        values = sorted((score.goodness for score in row_scores.values()), reverse=True)
        return abs(values[0] - values[1]) if len(values) > 1 and all(map(math.isfinite, values[:2])) else 0.0

    scored = [(row, {s.config: s.metric_value(configs.rank_by) for s in row.scores}) for row in configs.rows]
    scored.sort(key=lambda item: -margin(item[1]))
    shown = _db if configs.rank_by == "sqnr" else _value
    rows = tuple(
        (row.fqn, *(shown(values[c].value) if c in values else "float" for c in configs.configs), row.best)
        for row, values in scored[:limit]
    )
    wins = Counter(row.best for row in configs.rows)
    summary = ", ".join(f"{config} {wins[config]}" for config in configs.configs)
    note = f"best per layer: {summary}" + (f"; {_more(len(scored), len(rows))}" if len(scored) > len(rows) else "")
    return Table(f"Candidate configs, local {configs.rank_by} per layer", ("layer", *configs.configs, "best"), rows, note)


def comparison_tables(comparison: Comparison, limit: int = DEFAULT_LIMIT) -> list[Table]:
    tables = []
    if comparison.activations is not None:
        tables.append(activation_table(comparison.activations, limit))
    if comparison.weights is not None:
        tables.append(weight_table(comparison.weights, limit))
    if comparison.configs is not None:
        tables.append(config_table(comparison.configs, limit))
    return tables


def tables_as_text(tables: list[Table]) -> list[str]:
    lines: list[str] = []
    for table in tables:
        widths = [max(len(cell) for cell in column) for column in zip(table.header, *table.rows)]
        lines.append(table.title + ":")
        for cells in (table.header, *table.rows):
            lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip())
        if table.note:
            lines.append(f"  ({table.note})")
        lines.append("")
    return lines
