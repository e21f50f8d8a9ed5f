"""Plugin discovery, in two stages: metadata first, imports on demand.

Every detector and metric, built-in or third-party, is an entry point: a
detector named by its id (``vendor.name``) in ``qinsight.detectors``, a metric
by its name in ``qinsight.metrics``. Discovery (:func:`installed`) reads only
distribution metadata; a plugin's module is imported when that plugin is asked
for (by id or name, by the ``QINSIGHT_DETECTORS`` allowlist, or by a report
file holding its findings), never before. A detector that fails to load becomes
a :class:`~qinsight.core.report.DetectorFailure` at stage ``load`` and the
others run; ``strict=True`` raises :class:`PluginLoadError` instead, which is
also what an unloadable metric raises.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Final

import attrs

from qinsight.core.entry_points import PluginEntry, installed, load_entry
from qinsight.core.errors import PluginLoadError
from qinsight.core.findings import Finding
from qinsight.core.report import DetectorFailure, FailureStage
from qinsight.plugin.detector import API_VERSION, Detector

DETECTORS: Final = "qinsight.detectors"
METRICS: Final = "qinsight.metrics"
ENV_ALLOWLIST: Final = "QINSIGHT_DETECTORS"
ID_PATTERN: Final = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")
# The built-in detectors' entry points, as pyproject.toml declares them: used where qinsight's own
# metadata is not installed (a source checkout on sys.path). Targets, not imports: nothing is
# imported before a detector is asked for.
BUILTIN_DETECTORS: Final = {
    "qinsight.per_channel": "qinsight.detectors.per_channel:PerChannelDetector",
    "qinsight.dynamic_static": "qinsight.detectors.dynamic_static:DynamicStaticDetector",
    "qinsight.equalization": "qinsight.detectors.equalization_detector:InputWeightEqualizationDetector",
    "qinsight.outliers": "qinsight.detectors.outliers:OutlierDetector",
    "qinsight.precision": "qinsight.detectors.op_precision:PrecisionDetector",
    "qinsight.range_conflict": "qinsight.detectors.range_conflict:RangeConflictDetector",
    "qinsight.formats": "qinsight.detectors.weight_formats:FormatDetector",
}
# What a diagnosis runs unless told: every built-in but the torchao formats' (opt-in: ``plan --flow torchao`` runs it)
OPT_IN_IDS: Final = ("qinsight.formats",)
DEFAULT_IDS: Final = tuple(name for name in BUILTIN_DETECTORS if name not in OPT_IN_IDS)


def installed_detectors() -> tuple[PluginEntry, ...]:
    """The detectors installed in this environment."""
    return installed(DETECTORS)


def find_entry(group: str, name: str) -> PluginEntry | None:
    """The installed plugin ``name`` of ``group``; for detectors, a built-in if qinsight's metadata is missing."""
    entry = next((e for e in installed(group) if e.name == name), None)
    if entry is None and group == DETECTORS and name in BUILTIN_DETECTORS:
        entry = PluginEntry(
            group=group, name=name, distribution="qinsight", version="(source)", target=BUILTIN_DETECTORS[name]
        )
    return entry


def validate_detector_class(obj: object, detector_id: str, source: str) -> type:
    """``obj`` if it is a detector class for ``detector_id`` this qinsight can run."""

    def fail(reason: str) -> PluginLoadError:
        return PluginLoadError(detector_id, source, reason)

    if not isinstance(obj, type):
        raise fail(f"the entry point gives {type(obj).__name__}, not a detector class")
    if getattr(obj, "id", None) != detector_id:
        raise fail(f"its id is {getattr(obj, 'id', None)!r}, but it is registered as {detector_id!r}")
    if not ID_PATTERN.match(detector_id):
        raise fail(f"the id {detector_id!r} does not match vendor.name ({ID_PATTERN.pattern})")
    version = getattr(obj, "api_version", None)
    if version != API_VERSION:
        raise fail(f"it was written for detector API version {version!r}; this qinsight speaks version {API_VERSION}")
    for method in ("insert_points", "analyze"):
        if not callable(getattr(obj, method, None)):
            raise fail(f"it has no {method}() method")
    finding_type = getattr(obj, "finding_type", None)
    if not (isinstance(finding_type, type) and issubclass(finding_type, Finding)):
        raise fail("its finding_type is not a subclass of qinsight.types.Finding")
    return obj


def load_detector_class(detector_id: str) -> type:
    """Import and validate the detector ``detector_id``; :class:`PluginLoadError` otherwise."""
    entry = find_entry(DETECTORS, detector_id)
    if entry is None:
        known = ", ".join(e.name for e in installed(DETECTORS)) or "none"
        raise PluginLoadError(detector_id, "this environment", f"no such detector is installed (installed: {known})")
    return validate_detector_class(load_entry(entry, kind="detector"), detector_id, entry.source)


def finding_type(detector_id: str) -> type[Finding] | None:
    """The Finding class of ``detector_id``, or None when it cannot be loaded here."""
    try:
        cls = load_detector_class(detector_id)
    except PluginLoadError:
        return None
    found: type[Finding] = cls.finding_type  # type: ignore[attr-defined]
    return found


def _instantiate(cls: type, backend: str) -> Detector:
    # Detectors that take a backend get the pipeline's; the rest their defaults.
    has_backend = attrs.has(cls) and "backend" in attrs.fields_dict(cls)
    detector: Detector = cls(backend=backend) if has_backend else cls()
    return detector


def requested_ids(ids: Sequence[str] | None) -> tuple[str, ...]:
    """``ids``, else the ``QINSIGHT_DETECTORS`` allowlist, else the defaults."""
    if ids is not None:
        return tuple(ids)
    allowlist = os.environ.get(ENV_ALLOWLIST, "").strip()
    if allowlist:
        return tuple(part.strip() for part in allowlist.split(",") if part.strip())
    return DEFAULT_IDS


def resolve_detectors(
    ids: Sequence[str] | None, *, backend: str = "x86", strict: bool = False
) -> tuple[tuple[Detector, ...], tuple[DetectorFailure, ...]]:
    """Detectors for ``ids`` with default parameters, and the ones that failed to load."""
    detectors: list[Detector] = []
    failures: list[DetectorFailure] = []
    for detector_id in requested_ids(ids):
        try:
            detectors.append(_instantiate(load_detector_class(detector_id), backend))
        except PluginLoadError as exc:
            if strict:
                raise
            failures.append(DetectorFailure(detector=detector_id, stage=FailureStage.LOAD, error=exc.reason))
        except Exception as exc:  # the detector's own constructor failed
            if strict:
                raise PluginLoadError(detector_id, "its constructor", f"{type(exc).__name__}: {exc}") from exc
            failures.append(
                DetectorFailure(detector=detector_id, stage=FailureStage.LOAD, error=f"{type(exc).__name__}: {exc}")
            )
    return tuple(detectors), tuple(failures)
