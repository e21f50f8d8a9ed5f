"""Every exception qinsight raises, in one place.

Every error is a :class:`QinsightError`; each says in one sentence what is wrong
and where (the parameter, module, batch or file at fault) and keeps that data on
attributes, so programs need not parse the message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROLS_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def describe(exc: BaseException) -> str:
    """``TypeName: message``: how an error is named where it is recorded or passed on (reports, other ranks)."""
    return f"{type(exc).__name__}: {exc}"


def printable(text: str, *, lines: bool = True) -> str:
    """``text`` with control characters (terminal escapes included) shown as ``\\xNN``; its newlines and
    tabs kept where ``lines``, else shown so too (an error's one line, whatever a file's keys hold)."""
    controls = _CONTROLS_BUT_LINES if lines else _CONTROLS
    return controls.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


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


class InvalidValueError(QinsightError, ValueError):
    """A value refused by one of qinsight's immutable types (a statistic of the wrong length, a
    smoothing factor that is not positive, two specs that cannot merge): the message says which."""


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
    """A detector or metric plugin could not be loaded or is not valid.

    ``name`` is the plugin's name (a detector id or a metric name) and ``kind``
    says which of the two it is.
    """

    def __init__(self, name: str, source: str, reason: str, *, kind: str = "detector") -> None:
        super().__init__(name, source, reason)
        self.name = name
        self.source = source
        self.reason = reason
        self.kind = kind

    @property
    def detector(self) -> str:
        """The plugin's name (kept for programs written when only detectors were plugins)."""
        return self.name

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_plugin_load_error, (self.name, self.source, self.reason, self.kind))

    def __str__(self) -> str:
        return f"qinsight failed to load {self.kind} {self.name} from {self.source}: {self.reason}"


def _rebuild_plugin_load_error(name: str, source: str, reason: str, kind: str) -> PluginLoadError:
    return PluginLoadError(name, source, reason, kind=kind)


class MissingExtraError(QinsightError, ImportError):
    """An optional dependency is not installed; the message says which extra to install."""


class NotFoundError(QinsightError, KeyError):
    """A lookup by name found nothing (``report.result("x")``, ``comparison.layer("fc9")``...): every
    lookup of qinsight's result types raises it, naming what is there (the first few)."""

    def __init__(self, what: str, wanted: object, known: Iterable[str]) -> None:
        names = list(known)
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        self.what, self.wanted = what, wanted
        self.message = f"no {what} {wanted!r}; there are: {shown or 'none'}"
        super().__init__(self.message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_not_found, (self.what, self.wanted, self.message))

    def __str__(self) -> str:  # KeyError quotes its argument
        return self.message


def _rebuild_not_found(what: str, wanted: object, message: str) -> NotFoundError:
    error = NotFoundError(what, wanted, ())
    error.message = message
    return error


class UsageError(QinsightError):
    """The command line was used wrongly (a bad option value, a missing option)."""


class ReportFileError(QinsightError):
    """A report file that cannot be read: names the file and, where known, the JSON path."""

    def __init__(self, source: str, problem: str, location: str | None = None) -> None:
        problem, location = printable(problem, lines=False), location and printable(location, lines=False)
        super().__init__(source, problem, location)
        self.source = source
        self.problem = problem
        self.location = location

    def __str__(self) -> str:
        where = f" @ {self.location}" if self.location else ""
        return f"{self.source}: {self.problem}{where}"


class ReportVersionError(ReportFileError):
    """A file of a schema major version this qinsight cannot read (``readable``: the version it reads)."""

    def __init__(self, source: str, found: tuple[int, int], readable: tuple[int, int]) -> None:
        problem = (
            f"written with report schema {found[0]}.{found[1]}; this qinsight reads major version "
            f"{readable[0]} (schema {readable[0]}.{readable[1]})"
        )
        super().__init__(source, problem, "$.schema_version")
        self.found = found
        self.readable = readable

    def __reduce__(self) -> tuple[object, ...]:
        return (ReportVersionError, (self.source, self.found, self.readable))


class ComparisonError(QinsightError, ValueError):
    """A site's float and quantized outputs cannot be compared (shapes that differ: they are not read at
    the same point of the model)."""


class MergeError(QinsightError, ValueError):
    """Statistics or reports that are not of one model and one setup, so they cannot be merged."""


class ShardError(QinsightError):
    """Another process of a distributed run failed; ``rank`` names it, the message is its error."""

    def __init__(self, rank: int, error: str) -> None:
        super().__init__(rank, error)
        self.rank = rank
        self.error = error

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.error}"
