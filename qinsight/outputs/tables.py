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
    LoweredComparison,
    MetricValue,
    ProgramCost,
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
    return Table(
        "Weights, worst first (SQNR dB)",
        ("layer", "kind", "sqnr", "bn folded", "left in float"),
        rows,
        _more(len(layers), len(rows)),
    )


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
    note += "".join(f"; {parted}" for parted in _left_float(configs))
    return Table(
        f"Candidate configs, local {configs.rank_by} per layer", ("layer", *configs.configs, "best"), rows, note
    )


def _left_float(configs: ConfigComparison) -> list[str]:
    """Where the configs part most: the layers each leaves in float that another quantizes."""
    parted = []
    for config in configs.configs:
        names = [row.fqn for row in configs.rows if all(score.config != config for score in row.scores)]
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            parted.append(f"{config} leaves {len(names)} in float that another quantizes: {shown}")
    return parted


def _shown(metric: MetricValue) -> str:
    return _db(metric.value) if metric.name == "sqnr" else _value(metric.value)


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB"


def _unlowered(names: tuple[str, ...]) -> str:
    if not names:
        return ""
    shown = ", ".join(name.partition(":")[0] for name in names[:5])
    return f"not lowered alone: {shown}{' and more' if len(names) > 5 else ''} (the file says why)"


def lowered_tables(lowered: LoweredComparison, limit: int = DEFAULT_LIMIT) -> list[Table]:
    """The lowered program's outputs against the reference and the float model, its cost, and the
    layers whose lowered kernel departs most from the reference."""
    names = tuple(metric.name for metric in lowered.lowered_vs_reference)
    pairs = (
        ("lowered vs reference", lowered.lowered_vs_reference),
        ("lowered vs float", lowered.lowered_vs_float),
        ("reference vs float", lowered.reference_vs_float),
    )
    outputs = Table(
        f"Lowered for {lowered.backend} ({lowered.runtime}): outputs over {lowered.batches} batches",
        ("outputs", *(f"{name} (dB)" if name == "sqnr" else name for name in names)),
        tuple((label, *(_shown(metric) for metric in metrics)) for label, metrics in pairs),
    )
    costs: list[tuple[str, ProgramCost]] = [("int8 program", lowered.program)]
    if lowered.float_program is not None:
        costs.append(("float program", lowered.float_program))
    ratios = []
    if lowered.speedup is not None and lowered.size_ratio is not None:
        ratios.append(f"int8: {lowered.speedup:.2f}x the float program's speed, {lowered.size_ratio:.2f}x its size")
    cost = Table(
        "Lowered programs, median time per batch",
        ("program", "ms per batch", "size"),
        tuple((label, f"{c.latency_ms:.2f}", _megabytes(c.size_bytes)) for label, c in costs),
        "; ".join(ratios),
    )
    tables = [outputs, cost]
    if lowered.layers or lowered.unlowered:
        worst = lowered.worst(count=None)
        rows = tuple(
            (
                layer.fqn,
                layer.kind,
                _db(layer.sqnr),
                _db(layer.propagated),
                "float" if layer.max_steps is None else f"{layer.max_steps:.0f}",
                f"{100 * layer.mismatched:.2f}",
            )
            for layer in worst[:limit]
        )
        tables.append(
            Table(
                "Lowered kernels vs the reference, worst local first (SQNR dB)",
                ("layer", "kind", "local", "propagated", "max steps", "% differing"),
                rows,
                "; ".join(filter(None, [_more(len(worst), len(rows)), _unlowered(lowered.unlowered)])),
            )
        )
    return tables


def comparison_tables(comparison: Comparison, limit: int = DEFAULT_LIMIT) -> list[Table]:
    tables = []
    if comparison.activations is not None:
        tables.append(activation_table(comparison.activations, limit))
    if comparison.weights is not None:
        tables.append(weight_table(comparison.weights, limit))
    if comparison.configs is not None:
        tables.append(config_table(comparison.configs, limit))
    if comparison.lowered is not None:
        tables.extend(lowered_tables(comparison.lowered, limit))
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
