"""From frozen statistics to a Report: the detectors' analysis, run once per diagnosis.

Shared by a :class:`~qinsight.pipeline.session.Session` (one process, or rank 0
of a distributed run, on the merged statistics) and by
:func:`~qinsight.pipeline.merge.merge_reports` (on report files).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qinsight._version import __version__
from qinsight.core.comparison import Comparison
from qinsight.core.equalization import EqualizationMapping
from qinsight.core.errors import InvalidParameterError, describe
from qinsight.core.report import DetectorFailure, DetectorResult, FailureStage, Report, ReportMetadata
from qinsight.core.stats import ObservedStats
from qinsight.core.suggestions import merge_suggestions
from qinsight.plugin.detector import Detector, ModelView, check_result
from qinsight.plugin.discovery import DEFAULT_IDS, resolve_detectors

DetectorChoice = Detector | str


def default_detectors(backend: str = "x86") -> tuple[Detector, ...]:
    """The built-in detectors with their default parameters."""
    detectors, _ = resolve_detectors(DEFAULT_IDS, backend=backend, strict=True)
    return detectors


def choose_detectors(
    detectors: Sequence[DetectorChoice] | None, backend: str, strict: bool
) -> tuple[tuple[Detector, ...], tuple[DetectorFailure, ...]]:
    """Detector instances for ``detectors``: instances as given, ids loaded from the registry."""
    if detectors is None:
        return resolve_detectors(None, backend=backend, strict=strict)
    if not detectors:
        raise InvalidParameterError(
            "diagnose", "detectors", [], "at least one detector, or None for the defaults (detectors is empty)"
        )
    chosen: list[Detector] = []
    failures: list[DetectorFailure] = []
    for detector in detectors:
        if isinstance(detector, str):
            loaded, failed = resolve_detectors([detector], backend=backend, strict=strict)
            chosen.extend(loaded)
            failures.extend(failed)
        else:
            chosen.append(detector)
    ids = [d.id for d in chosen]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise InvalidParameterError(
            "diagnose",
            "detectors",
            repeated,
            f"each detector once per diagnosis; given more than once: {', '.join(repeated)}",
        )
    return tuple(chosen), tuple(failures)


def analyze(
    view: ModelView,
    detectors: Sequence[Detector],
    stats: ObservedStats,
    *,
    metadata: ReportMetadata,
    failures: Sequence[DetectorFailure] = (),
    strict: bool = False,
) -> Report:
    """Every detector's result on ``stats``; a detector that raises is recorded (``strict``: raised)."""
    failed = list(failures)
    results: list[DetectorResult] = []
    for detector in detectors:
        try:
            results.append(check_result(detector, detector.analyze(view, stats)))
        except Exception as exc:
            if strict:
                raise
            failed.append(DetectorFailure(detector=detector.id, stage=FailureStage.ANALYZE, error=describe(exc)))
    suggestions, conflicts = merge_suggestions(s for r in results for s in r.suggestions)
    return Report(
        metadata=metadata,
        sites=view.sites + view.ops,
        observations=stats.observations,
        results=tuple(results),
        suggestions=suggestions,
        conflicts=conflicts,
        equalization_mapping=EqualizationMapping.of(suggestions),
        failures=tuple(failed),
    )


def metadata(model: str, frontend: str, backend: str, batches: int) -> ReportMetadata:
    """The metadata of a report made now, by this qinsight and torch."""
    return ReportMetadata(
        model=model,
        frontend=frontend,
        backend=backend,
        batches=batches,
        qinsight_version=__version__,
        torch_version=torch.__version__,
    )


def comparison_report(comparison: Comparison, *, model_name: str = "model") -> Report:
    """A report file's worth holding only ``comparison``, for when no diagnosis ran.

    To keep a comparison with a diagnosis instead: ``report.with_comparison(comparison)``.

    Args:
        comparison: what :func:`qinsight.compare_weights` and the others measured.
        model_name: the name the report gives the model.

    Returns:
        A :class:`Report` with no findings and the comparison, to save and show.
    """
    measured = comparison.activations.layers if comparison.activations is not None else ()
    return Report(
        metadata=metadata(model_name, "", "", max((layer.batches for layer in measured), default=0)),
        sites=(),
        observations=(),
        results=(),
        suggestions=(),
        comparison=comparison,
    )
