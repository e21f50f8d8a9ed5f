"""A module-major view of a Report: each module with its features from every detector.

A feature is a number or a per-channel series taken from a finding's fields,
named ``<detector>.<field>`` with the detector's vendor prefix dropped for the
built-ins (``dynamic_static.input.statistic``, ``outliers.ratios``). The view
is what plots, the HTML page and the ``plot`` command read. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import cast

import attrs

from qinsight.core.errors import NotFoundError
from qinsight.core.findings import Finding
from qinsight.core.report import Report


@attrs.frozen(kw_only=True)
class Feature:
    name: str
    value: float | None = None  # a scalar feature
    channels: tuple[float, ...] | None = None  # a per-channel feature

    @property
    def per_channel(self) -> bool:
        return self.channels is not None


@attrs.frozen(kw_only=True)
class ModuleRow:
    fqn: str
    kind: str
    verdicts: tuple[tuple[str, str], ...]  # (detector, verdict)
    features: tuple[Feature, ...]

    def feature(self, name: str) -> Feature | None:
        return next((f for f in self.features if f.name == name), None)


def _short(detector: str) -> str:
    return detector.removeprefix("qinsight.")


def _numeric_series(value: object) -> tuple[float, ...] | None:
    if (
        isinstance(value, tuple)
        and value
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        return tuple(float(v) for v in value)
    return None


def _features(prefix: str, value: attrs.AttrsInstance) -> Iterator[Feature]:
    for field in attrs.fields(type(value)):
        item = getattr(value, field.name)
        name = f"{prefix}.{field.name}"
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, (int, float)):
            yield Feature(name=name, value=float(item))
        elif (series := _numeric_series(item)) is not None:
            if not field.name.endswith("_channels"):  # channel index lists are not per-channel values
                yield Feature(name=name, channels=series)
        elif attrs.has(type(item)):
            yield from _features(name, cast(attrs.AttrsInstance, item))


@attrs.frozen(kw_only=True)
class ReportView:
    rows: tuple[ModuleRow, ...]

    @classmethod
    def of(cls, report: Report) -> ReportView:
        by_fqn: dict[str, list[tuple[str, Finding]]] = {}
        for result in report.results:
            for finding in result.findings:
                by_fqn.setdefault(finding.fqn, []).append((result.detector, finding))
        rows = []
        for site in report.sites:
            found = by_fqn.get(site.fqn, [])
            features = tuple(
                feature
                for detector, finding in found
                if attrs.has(type(finding))
                for feature in _features(_short(detector), cast(attrs.AttrsInstance, finding))
                if not feature.name.endswith(".fqn")
            )
            verdicts = tuple((detector, finding.verdict) for detector, finding in found)
            rows.append(ModuleRow(fqn=site.fqn, kind=site.kind.value, verdicts=verdicts, features=features))
        return cls(rows=tuple(rows))

    def filter(self, modules: Iterable[str] | None = None, features: Iterable[str] | None = None) -> ReportView:
        """Only the named modules (all if None) and features (all if None)."""
        wanted_modules = None if modules is None else set(modules)
        wanted_features = None if features is None else set(features)
        rows = tuple(
            attrs.evolve(
                row,
                features=tuple(f for f in row.features if wanted_features is None or f.name in wanted_features),
            )
            for row in self.rows
            if wanted_modules is None or row.fqn in wanted_modules
        )
        return ReportView(rows=rows)

    def feature_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.name for row in self.rows for f in row.features))

    def plottable(self) -> tuple[str, ...]:
        """Features with at least one finite value somewhere."""

        def finite(feature: Feature) -> bool:
            values = feature.channels if feature.channels is not None else (feature.value,)
            return any(v is not None and math.isfinite(v) for v in values)

        return tuple(dict.fromkeys(f.name for row in self.rows for f in row.features if finite(f)))

    def row(self, fqn: str) -> ModuleRow:
        for row in self.rows:
            if row.fqn == fqn:
                return row
        raise NotFoundError("module", fqn, (r.fqn for r in self.rows))
