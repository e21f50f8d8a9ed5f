"""Every error qinsight raises on purpose, by the name a program catches it by.

All are :class:`QinsightError`; each message is one sentence naming what to change, and each keeps
its data on attributes (:mod:`qinsight.core.errors` defines them).
"""

from __future__ import annotations

from qinsight.core.errors import (
    CalibrationError,
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

__all__ = [
    "CalibrationError",
    "FrontendError",
    "InvalidParameterError",
    "InvalidValueError",
    "MergeError",
    "MissingExtraError",
    "NotFoundError",
    "ObserverError",
    "PluginLoadError",
    "QinsightError",
    "ReportFileError",
    "ReportVersionError",
    "ShardError",
    "UsageError",
]
