"""Reports of one model calibrated on disjoint data, merged into the report of all the data.

For runs that never shared a process group (a batch job on many machines):
each writes its report file; :func:`merge_reports` (``qinsight merge``)
merges their statistics exactly as a distributed run would and runs the
detectors once more on the merged statistics, without the model. A report
file holds everything detectors read: the sites, the activation statistics
and, for detectors that read weights, the weights' statistics (the ``weight``
side), which also tells reports of different weights apart.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import attrs
import torch
from torch import nn

from qinsight.core.errors import MergeError, NotFoundError, PluginLoadError
from qinsight.core.fx_activations import FxActivations
from qinsight.core.report import DetectorResult, Parameter, Report
from qinsight.core.sites import OpSite, Side
from qinsight.core.stats import ObservedStats
from qinsight.pipeline.analysis import analyze, metadata
from qinsight.plugin.detector import Detach, Detector
from qinsight.plugin.discovery import load_detector_class


class RecordedView:
    """The model as a report file records it: its sites. Weights and running are not there."""

    def __init__(self, report: Report) -> None:
        self._report = report
        self._sites = {site.fqn: site for site in report.sites}

    @property
    def frontend(self) -> str:
        return self._report.metadata.frontend

    @property
    def model(self) -> nn.Module:
        self._absent("the model")

    @property
    def sites(self) -> tuple[OpSite, ...]:
        return tuple(site for site in self._report.sites if site.kind.is_layer)

    @property
    def ops(self) -> tuple[OpSite, ...]:
        return tuple(site for site in self._report.sites if not site.kind.is_layer)

    def site(self, fqn: str) -> OpSite:
        try:
            return self._sites[fqn]
        except KeyError:
            raise NotFoundError("site", fqn, self._sites) from None

    def weight(self, fqn: str) -> torch.Tensor:
        self._absent(f"the weight of {fqn} (a detector reads weights from reports as Side.WEIGHT observations)")

    def attach(self, fqn: str, side: Side, observe: Callable[[torch.Tensor], object]) -> Detach:
        self._absent("a model to observe")

    def _absent(self, what: str) -> NoReturn:
        raise MergeError(f"a report file does not hold {what}")


def _recorded_detector(result: DetectorResult) -> Detector:
    """The detector that made ``result``, with the parameters it recorded."""
    try:
        cls = load_detector_class(result.detector)
    except PluginLoadError as exc:
        raise MergeError(f"cannot rerun detector {result.detector} on the merged statistics: {exc.reason}") from exc
    if not attrs.has(cls):
        return typing.cast(Detector, cls())
    attrs.resolve_types(cls)
    fields = attrs.fields_dict(cls)
    kwargs: dict[str, Any] = {}
    for parameter in result.parameters:
        field = fields.get(parameter.name)
        if field is None:
            raise MergeError(
                f"detector {result.detector} has no parameter {parameter.name} here: another version made the reports"
            )
        kind = field.type
        kwargs[parameter.name] = (
            kind(parameter.value) if isinstance(kind, type) and issubclass(kind, enum.Enum) else parameter.value
        )
    return typing.cast(Detector, cls(**kwargs))


def _setup(report: Report) -> tuple[object, ...]:
    """What must be the same in every report merged: the model's sites and how it was diagnosed."""
    meta = report.metadata
    detectors: tuple[tuple[str, tuple[Parameter, ...]], ...] = tuple((r.detector, r.parameters) for r in report.results)
    return (meta.model, meta.frontend, meta.backend, report.sites, detectors)


_SETUP_NAMES = ("model name", "frontend", "backend", "sites", "detectors or their parameters")


def _check_mergeable(reports: Sequence[Report]) -> None:
    if not reports:
        raise MergeError("no reports to merge")
    first = _setup(reports[0])
    for index, report in enumerate(reports):
        if report.comparison is not None:
            raise MergeError(
                f"report {index + 1} holds a comparison: comparisons keep metric values, not the sums they come from, "
                "so they do not merge (compare with distributed=True instead)"
            )
        for name, ours, theirs in zip(_SETUP_NAMES, first, _setup(report)):
            if ours != theirs:
                raise MergeError(
                    f"report {index + 1} differs from report 1 in its {name}: not one model diagnosed one way"
                )


def merge_reports(reports: Sequence[Report]) -> Report:
    """The report of all the data of ``reports``: one model, diagnosed the same way, on disjoint batches.

    Statistics merge as in a distributed run (exact for counts, minima, maxima and per-batch
    percentiles; sums to float rounding), then each detector that made the reports runs again, with its
    recorded parameters, on the merged statistics.

    Args:
        reports: the parts (``qinsight diagnose --shard i/n``, ``diagnose(..., shard=...)``).

    Returns:
        The merged :class:`Report`.

    Raises:
        MergeError: the reports are of different models, weights, sites, backends or detector settings, or
            hold comparisons.
    """
    _check_mergeable(reports)
    first = reports[0]
    stats = ObservedStats.merged([ObservedStats(observations=r.observations) for r in reports])
    detectors = [_recorded_detector(result) for result in first.results]
    ran = {d.id for d in detectors}
    meta = first.metadata
    merged = analyze(
        RecordedView(first),
        detectors,
        stats,
        metadata=metadata(meta.model, meta.frontend, meta.backend, sum(r.metadata.batches for r in reports)),
        failures=[f for f in first.failures if f.detector not in ran],  # loading or insert points: as in every shard
    )
    # a merge runs no model, so it verifies nothing: its FX kernels are unchecked, as an unverified run's are
    return attrs.evolve(merged, fx_activations=FxActivations.merged([r.fx_activations for r in reports]))
