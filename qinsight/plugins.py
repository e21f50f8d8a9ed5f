"""Detector discovery: the ``qinsight.detectors`` entry-point group.

Every detector, built-in or third-party, is an entry point named by its id
(``vendor.name``) whose object is the detector class. Discovery reads only
distribution metadata; a detector's module is imported when that detector is
asked for (by id, by the ``QINSIGHT_DETECTORS`` allowlist, or by a report file
holding its findings), never before. A detector that fails to load becomes a
:class:`~qinsight.report.DetectorFailure` at stage ``load`` and the others run;
``strict=True`` raises :class:`PluginLoadError` instead.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Sequence
from typing import Final

import attrs

from qinsight.detector import API_VERSION, Detector
from qinsight.errors import PluginLoadError
from qinsight.findings import Finding
from qinsight.report import DetectorFailure, FailureStage

GROUP: Final = "qinsight.detectors"
ENV_ALLOWLIST: Final = "QINSIGHT_DETECTORS"
ID_PATTERN: Final = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")
DEFAULT_IDS: Final = ("qinsight.per_channel", "qinsight.dynamic_static", "qinsight.equalization", "qinsight.outliers")


@attrs.frozen(kw_only=True)
class DetectorEntry:
    """An installed detector, known from metadata only (nothing imported)."""

    id: str
    distribution: str
    version: str
    target: str  # "module:Class"

    @property
    def source(self) -> str:
        return f"{self.distribution} {self.version} [{self.target}]"


def installed_detectors() -> tuple[DetectorEntry, ...]:
    """The detectors installed in this environment, first distribution on sys.path winning a name."""
    entries: dict[str, DetectorEntry] = {}
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != GROUP or ep.name in entries:
                continue
            name = dist.metadata["Name"] or "unknown"
            entries[ep.name] = DetectorEntry(id=ep.name, distribution=name, version=dist.version, target=ep.value)
    return tuple(sorted(entries.values(), key=lambda e: e.id))


def _builtin(detector_id: str) -> type | None:
    """The built-in classes, for a source checkout where qinsight's own entry points are not installed."""
    from qinsight.detectors import (
        DynamicStaticDetector,
        InputWeightEqualizationDetector,
        OutlierDetector,
        PerChannelDetector,
    )

    builtins: dict[str, type] = {
        cls.id: cls
        for cls in (PerChannelDetector, DynamicStaticDetector, InputWeightEqualizationDetector, OutlierDetector)
    }
    return builtins.get(detector_id)


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
        raise fail("its finding_type is not a subclass of qinsight.Finding")
    return obj


def load_detector_class(detector_id: str) -> type:
    """Import and validate the detector ``detector_id``; :class:`PluginLoadError` otherwise."""
    entry = next((e for e in installed_detectors() if e.id == detector_id), None)
    if entry is None:
        builtin = _builtin(detector_id)
        if builtin is not None:
            return builtin
        known = ", ".join(e.id for e in installed_detectors()) or "none"
        raise PluginLoadError(detector_id, "this environment", f"no such detector is installed (installed: {known})")
    try:
        obj = importlib.metadata.EntryPoint(name=entry.id, value=entry.target, group=GROUP).load()
    except Exception as exc:  # an import error of any kind is the plugin's, reported alike
        raise PluginLoadError(detector_id, entry.source, f"{type(exc).__name__}: {exc}") from exc
    return validate_detector_class(obj, detector_id, entry.source)


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
            failures.append(DetectorFailure(detector=detector_id, stage=FailureStage.LOAD, error=f"{type(exc).__name__}: {exc}"))
    return tuple(detectors), tuple(failures)
