"""Every field two reports differ in, at its JSON path: the part of a diff no typed change covers.

The two reports are compared as the files they would be written as. Lists of
objects are matched by their natural key (``fqn``, ``detector``, ``key``,
``name``, ``config``) so a path reads ``$.observations[fc1:pre].stats.max``;
numbers move beyond the tolerances, lists of numbers are one change each.
What the typed parts of :class:`~qinsight.outputs.diff.ReportDiff` already say
is left out: modules and detectors added or removed, findings' verdicts and
scalar numbers, suggestions whose description changed, comparison metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from qinsight.core.report import Report
from qinsight.outputs.serde import report_to_dict

_KEYS = ("fqn", "detector", "key", "name", "config")
Change = tuple[str, "str | None", "str | None"]


def _key_of(items: list[Any]) -> str | None:
    """The field that names each object of ``items`` uniquely, if there is one."""
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    for key in _KEYS:
        names = [item.get(key) for item in items]
        if all(isinstance(n, str) for n in names) and len(set(names)) == len(names):
            return key
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def numbers_differ(before: float, after: float, rel_tol: float, abs_tol: float) -> bool:
    """Whether a number moved beyond the tolerances; NaN equals NaN, infinities equal only themselves."""
    if math.isnan(before) or math.isnan(after):
        return math.isnan(before) != math.isnan(after)
    if math.isinf(before) or math.isinf(after):
        return before != after
    return not math.isclose(before, after, rel_tol=rel_tol, abs_tol=abs_tol)


def _text(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


class _Walk:
    def __init__(self, rel_tol: float, abs_tol: float, covered: set[str]) -> None:
        self.rel_tol, self.abs_tol, self.covered = rel_tol, abs_tol, covered

    def same(self, a: Any, b: Any) -> bool:
        if isinstance(a, dict) and isinstance(b, dict) or isinstance(a, list) and isinstance(b, list):
            return next(self.changes("", a, b), None) is None  # == would take True for 1 inside
        if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):  # an object against a list or a value
            return False
        if isinstance(a, bool) or isinstance(b, bool):  # True == 1 in Python, not in the file
            return type(a) is type(b) and a == b
        x, y = _number(a), _number(b)
        if x is not None and y is not None:
            return not numbers_differ(x, y, self.rel_tol, self.abs_tol)
        return bool(a == b)

    def changes(self, path: str, a: Any, b: Any) -> Iterator[Change]:
        if path in self.covered:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                yield from self.pair(f"{path}.{key}", a, b, key)
        elif isinstance(a, list) and isinstance(b, list):
            yield from self.lists(path, a, b)
        elif not self.same(a, b):
            yield path, _text(a), _text(b)

    def pair(self, path: str, a: dict[str, Any], b: dict[str, Any], key: str) -> Iterator[Change]:
        if key not in b:
            yield path, _text(a[key]), None
        elif key not in a:
            yield path, None, _text(b[key])
        else:
            yield from self.changes(path, a[key], b[key])

    def lists(self, path: str, a: list[Any], b: list[Any]) -> Iterator[Change]:
        key = _key_of(a + b) if _key_of(a) and _key_of(b) else None
        if key is not None:
            before, after = {item[key]: item for item in a}, {item[key]: item for item in b}
            for name in [*before, *(n for n in after if n not in before)]:
                yield from self.pair(f"{path}[{name}]", before, after, name)
        elif all(_number(v) is not None for v in a + b) and len(a) == len(b):
            moved = sum(not self.same(x, y) for x, y in zip(a, b))
            if moved:
                yield path, f"{len(a)} values", f"{moved} of them moved"
        elif len(a) != len(b) or any(not self.same(x, y) for x, y in zip(a, b)):
            for index, (x, y) in enumerate(zip(a, b)):
                yield from self.changes(f"{path}[{index}]", x, y)
            if len(a) != len(b):
                yield f"{path}.length", str(len(a)), str(len(b))


def _covered(a: Report, b: Report, data_a: dict[str, Any], data_b: dict[str, Any]) -> set[str]:
    """Paths the typed parts of the diff speak for."""
    covered: set[str] = set()
    sites_a, sites_b = {s.fqn for s in a.sites}, {s.fqn for s in b.sites}
    covered |= {f"$.sites[{fqn}]" for fqn in sites_a ^ sites_b}
    results_a, results_b = {r.detector for r in a.results}, {r.detector for r in b.results}
    covered |= {f"$.results[{d}]" for d in results_a ^ results_b}
    for data in (data_a, data_b):
        for result in data.get("results", []):
            for finding in result.get("findings", []):
                prefix = f"$.results[{result['detector']}].findings[{finding.get('fqn')}]"
                covered.add(f"{prefix}.summary.verdict")
                covered |= {f"{prefix}.{k}" for k, v in finding.items() if _number(v) is not None}
                covered |= {
                    f"{prefix}.{k}.{n}"
                    for k, v in finding.items()
                    if isinstance(v, dict)
                    for n, x in v.items()
                    if _number(x) is not None
                }
    described_b = {s.fqn: s.describe() for s in b.suggestions}
    covered |= {
        f"$.suggestions[{s.fqn}]" for s in a.suggestions if s.fqn in described_b and described_b[s.fqn] != s.describe()
    }
    compared = [("weights", "layers", "metrics")]
    compared += [("activations", rows, field) for rows in ("layers", "ops") for field in ("propagated", "local")]
    for section, rows, field in compared:
        names = _row_names(data_a, section, rows) & _row_names(data_b, section, rows)
        covered |= {f"$.comparison.{section}.{rows}[{fqn}].{field}" for fqn in names}
    return covered


def _row_names(data: dict[str, Any], section: str, rows: str) -> set[str]:
    comparison = data.get("comparison") or {}
    part = comparison.get(section) or {}
    return {row["fqn"] for row in part.get(rows, [])}


def field_changes(a: Report, b: Report, rel_tol: float, abs_tol: float) -> list[Change]:
    """(JSON path, before, after) for every difference of ``a`` and ``b`` not covered by a typed change."""
    # every number a JSON number: long arrays are compared value by value, within the tolerances
    data_a, data_b = report_to_dict(a, packed=False), report_to_dict(b, packed=False)
    return list(_Walk(rel_tol, abs_tol, _covered(a, b, data_a, data_b)).changes("$", data_a, data_b))
