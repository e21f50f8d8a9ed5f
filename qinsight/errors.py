"""The exceptions qinsight raises.

Every error is a :class:`QinsightError`; each says in one sentence what is wrong
and where (the parameter, module or batch at fault) and keeps that data on
attributes, so programs need not parse the message.
"""

from __future__ import annotations


class QinsightError(Exception):
    """Root of every error qinsight raises on purpose."""


class InvalidParameterError(QinsightError, ValueError):
    """A detector or pipeline parameter is outside its valid range."""

    def __init__(self, owner: str, name: str, value: object, expected: str) -> None:
        super().__init__(owner, name, value, expected)
        self.owner = owner
        self.name = name
        self.value = value
        self.expected = expected

    def __str__(self) -> str:
        return f"{self.owner}: {self.name}={self.value!r} is invalid; expected {self.expected}"


class FrontendError(QinsightError):
    """The model cannot be read by the frontend that was asked to read it."""


class CalibrationError(QinsightError):
    """Calibration could not run or produced nothing to analyze.

    ``batch`` is the index of the calibration batch at fault, or ``None`` when
    the problem is not tied to one batch (for example, no batches at all).
    """

    def __init__(self, message: str, *, batch: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.batch = batch

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_calibration_error, (self.message, self.batch))

    def __str__(self) -> str:
        return self.message


def _rebuild_calibration_error(message: str, batch: int | None) -> CalibrationError:
    return CalibrationError(message, batch=batch)


class ObserverError(QinsightError):
    """An observer received data it cannot fold into its statistics."""


class PluginLoadError(QinsightError):
    """A detector or metric plugin could not be loaded or is not valid."""

    def __init__(self, detector: str, source: str, reason: str) -> None:
        super().__init__(detector, source, reason)
        self.detector = detector
        self.source = source
        self.reason = reason

    def __str__(self) -> str:
        return f"qinsight failed to load detector {self.detector} from {self.source}: {self.reason}"
