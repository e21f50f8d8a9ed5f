"""Every error qinsight raises on purpose, by the name a program catches it by, and the warning it
gives with a typed note (:class:`NoteWarning`).

All errors are :class:`QinsightError`; each message is one sentence naming what to change, and each
keeps its data on attributes (:mod:`qinsight.core.errors` defines them).
"""

from __future__ import annotations

from qinsight.core.errors import (
    CalibrationError,
    ComparisonError,
    FrontendError,
    InvalidParameterError,
    InvalidValueError,
    MergeError,
    MissingExtraError,
    NotFoundError,
    ObserverError,
    PluginLoadError,
    QinsightError,
    ReportFileError,
    ReportVersionError,
    ShardError,
    UsageError,
)
from qinsight.core.notes import NoteWarning

__all__ = [
    "CalibrationError",
    "ComparisonError",
    "FrontendError",
    "InvalidParameterError",
    "InvalidValueError",
    "MergeError",
    "MissingExtraError",
    "NotFoundError",
    "NoteWarning",
    "ObserverError",
    "PluginLoadError",
    "QinsightError",
    "ReportFileError",
    "ReportVersionError",
    "ShardError",
    "UsageError",
]
