"""Reports and comparisons that must be the same however they were made (one process, ranks, merges)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import qinsight
from qinsight.core.comparison import ActivationComparison
from qinsight.core.report import Report

EXACT = {"min", "max", "channel_min", "channel_max"}  # floats that no summation order can change
# summed in float32 within a batch (the tail statistics' hot path), where a rank's one thread and the
# parent's two split the reduction differently: up to 2e-6 relative measured
FLOAT32_SUMS = {"power_sums", "abs_sum"}


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """JSON values equal: exactly, except sums (floats not in EXACT) to 1e-9 relative (float32 sums 1e-5)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]" if not path.endswith(tuple(EXACT)) else path)
    elif isinstance(a, float) and not any(path.endswith(key) or f".{key}[" in path for key in EXACT):
        float32 = any(f".{key}[" in path for key in FLOAT32_SUMS)
        assert math.isclose(a, b, rel_tol=1e-5 if float32 else 1e-9, abs_tol=1e-12), (path, a, b)
    else:
        assert a == b, (path, a, b)


def report_json(report: Report, tmp_path: Path, name: str) -> Any:
    path = tmp_path / f"{name}.json"
    qinsight.save_report(report, path)
    return json.loads(path.read_text())


def assert_same_report(a: Report, b: Report, tmp_path: Path) -> None:
    assert a.suggestions == b.suggestions and a.equalization_mapping == b.equalization_mapping
    assert [(r.detector, [(f.fqn, f.verdict) for f in r.findings]) for r in a.results] == [
        (r.detector, [(f.fqn, f.verdict) for f in r.findings]) for r in b.results
    ]
    assert_same(report_json(a, tmp_path, "a"), report_json(b, tmp_path, "b"))


def assert_same_comparison(a: ActivationComparison, b: ActivationComparison) -> None:
    assert [(layer.fqn, layer.batches, layer.compared_at) for layer in a.layers] == [
        (layer.fqn, layer.batches, layer.compared_at) for layer in b.layers
    ]
    for x, y in zip(a.layers, b.layers):
        for mine, theirs in zip(x.propagated + x.local, y.propagated + y.local):
            # float32 chunk dot products: their rounding depends on the threads each process runs
            assert mine.name == theirs.name and math.isclose(mine.value, theirs.value, rel_tol=1e-6), (
                x.fqn,
                mine,
                theirs,
            )
