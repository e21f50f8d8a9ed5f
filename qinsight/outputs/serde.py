"""Report files: versioned JSON through one cattrs converter.

This is the only module that imports cattrs. A file is a JSON object::

    {"format": "qinsight.report", "schema_version": [1, 0],
     "metadata": {...}, "sites": [...], "observations": [...], "results": [...],
     "suggestions": [...], "conflicts": [...], "equalization_mapping": {...}, "failures": [...]}

Files are data, never code: JSON only, no pickle. Each finding is written
with its fields, its ``type`` and a ``summary`` (verdict, actionable, reason)
so that a reader without the detector's plugin can still show it. It is read
back through the detector id of its result, and becomes a :class:`RawFinding`
that keeps its JSON verbatim when that detector is not installed. Non-finite
floats are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``, so a
file is strict JSON. Versioning rules: docs/file-format.md.
"""

from __future__ import annotations

import enum
import json
import math
import os
import typing
import warnings
from collections.abc import Callable
from typing import Any, Final, Literal

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, ClassValidationError, IterableValidationError, IterableValidationNote
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.preconf.json import make_converter
from cattrs.v import format_exception

from qinsight.core.errors import InvalidParameterError, ReportFileError, ReportVersionError
from qinsight.core.findings import Finding, check_finding
from qinsight.core.report import DetectorResult, ParameterValue, Report
from qinsight.outputs.arrays import (
    ArrayError,
    compacted,
    enums_in,
    enums_out,
    expanded,
    floats_in,
    floats_out,
    ints_in,
    ints_out,
    is_packed,
    standalone,
)
from qinsight.outputs.files import Compression, compressed, compression_of, decompressed, read_capped, write_atomically
from qinsight.outputs.upgrades import register_changed_records
from qinsight.plugin.discovery import finding_type

FORMAT: Final = "qinsight.report"
SCHEMA_VERSION: Final = (4, 6)
# 2.0 writes long arrays as typed binary (a list-or-object field is a retyping: a 1.x reader refuses
# 2.0 files with one clear error); every 1.x file is a valid 2.0 file and reads unchanged.
# 4.0 writes a budget as its own type (a plan's target is a Target or a Budget) and notes as their kind and
# text: 3.x files read unchanged, their notes of kind "other".
READABLE_MAJORS: Final = (1, 2, 3, 4)
MAX_BYTES: Final = 256 * 1024 * 1024
_RESERVED: Final = ("type", "summary")  # keys a finding's own fields may not use


@attrs.frozen(kw_only=True)
class RawFinding(Finding):
    """A finding whose detector is not installed here: its JSON, kept verbatim."""

    detector: str
    data: str  # the finding object as it stood in the file, as JSON text

    def _summary(self) -> dict[str, Any]:
        summary = json.loads(self.data).get("summary")
        return summary if isinstance(summary, dict) else {}

    @property
    def verdict(self) -> str:
        return str(self._summary().get("verdict", "unknown"))

    @property
    def actionable(self) -> bool:
        return self._summary().get("actionable") is True

    def reason(self) -> str:
        return str(self._summary().get("reason", f"finding of {self.detector}, which is not installed"))


# -- scalar hooks: strict, so a wrong type is an error rather than a silent conversion


def _float_out(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


_NON_FINITE: Final = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _float_in(value: object, _: object) -> float:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]  # the same NaN object every time, so reports compare equal
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number or one of 'nan', 'inf', '-inf', not {value!r}")
    return float(value)


def _exactly(kind: type) -> Callable[[object, object], Any]:
    def structure(value: object, _: object) -> Any:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}, not {type(value).__name__} {value!r}")
        return value

    return structure


def _parameter_in(value: object, _: object) -> ParameterValue:
    if not isinstance(value, (bool, int, float, str)):
        raise TypeError(f"expected a bool, number or string, not {type(value).__name__}")
    return value


def _at_index(exc: Exception, index: int, sequence: Any, item: object) -> IterableValidationError:
    """``exc`` as the error of element ``index``: cattrs' error tree, with the index on the path."""
    exc.__notes__ = [
        *getattr(exc, "__notes__", []),
        IterableValidationNote(f"Structuring {sequence} @ index {index}", index, item),
    ]
    return IterableValidationError(f"While structuring {sequence}", [exc], sequence)


def _at_field(exc: Exception, name: str, owner: type, hint: object) -> ClassValidationError:
    exc.__notes__ = [
        *getattr(exc, "__notes__", []),
        AttributeValidationNote(f"Structuring class {owner.__qualname__} @ attribute {name}", name, hint),
    ]
    return ClassValidationError(f"While structuring {owner.__name__}", [exc], owner)


def _is_sequence(hint: object) -> bool:
    args = typing.get_args(hint)
    return typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis


def _fail_fast_sequences(converter: cattrs.Converter) -> None:
    """``tuple[X, ...]`` structured element by element, stopping at the first bad one.

    cattrs' own hook collects an exception (and its traceback) for every bad
    element before the first is reported: 500,000 bad elements of a 1.5 MB file
    took 2.9 GB. Failing at the first keeps memory a small multiple of the file.
    """

    def structure(value: object, hint: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, not {type(value).__name__}")
        (item_hint, _) = typing.get_args(hint)
        items = []
        for index, item in enumerate(value):
            try:
                items.append(converter.structure(item, item_hint))
            except Exception as exc:
                raise _at_index(exc, index, hint, item_hint) from None
        return tuple(items)

    converter.register_structure_hook_func(_is_sequence, structure)

    def typed(item: type, decode: Callable[[dict[str, Any]], tuple[Any, ...]]) -> None:
        """A sequence of ``item`` read from a typed array (:mod:`.arrays`) or, as above, from a list."""

        def structure_typed(value: object, hint: Any) -> tuple[Any, ...]:
            return decode(value) if is_packed(value) else structure(value, hint)  # type: ignore[arg-type]

        converter.register_structure_hook_func(lambda hint: hint == tuple[item, ...], structure_typed)  # type: ignore[valid-type]

    typed(float, floats_in)
    typed(int, ints_in)

    def structure_enums(value: object, hint: Any) -> tuple[Any, ...]:
        return enums_in(value, typing.get_args(hint)[0]) if isinstance(value, dict) else structure(value, hint)

    converter.register_structure_hook_func(_is_enum_sequence, structure_enums)


def _is_enum_sequence(hint: object) -> bool:
    """``tuple[E, ...]`` for an enum E: per-channel statuses."""
    args = typing.get_args(hint)
    return _is_sequence(hint) and isinstance(args[0], type) and issubclass(args[0], enum.Enum)


def _packed_arrays(converter: cattrs.Converter) -> None:
    """Float and integer sequences of :data:`~.arrays.SHORTEST` values or more written as typed arrays."""
    converter.register_unstructure_hook_func(
        lambda hint: hint == tuple[float, ...], lambda values: floats_out(values) or [_float_out(v) for v in values]
    )
    converter.register_unstructure_hook_func(
        lambda hint: hint == tuple[int, ...], lambda values: ints_out(values) or list(values)
    )
    converter.register_unstructure_hook_func(
        _is_enum_sequence, lambda values: enums_out(values) or [v.value for v in values]
    )


def _converter(*, strict: bool, packed: bool = True) -> cattrs.Converter:
    converter = make_converter(forbid_extra_keys=strict)
    converter.register_unstructure_hook(float, _float_out)
    converter.register_structure_hook(float, _float_in)
    for kind in (str, int, bool):
        converter.register_structure_hook(kind, _exactly(kind))
    converter.register_structure_hook_func(lambda t: t == ParameterValue, _parameter_in)
    _fail_fast_sequences(converter)
    if packed:
        _packed_arrays(converter)
    _register_results(converter, strict=strict)
    register_changed_records(converter, strict=strict)
    return converter


# -- findings: tagged by type, decoded through their detector's finding_type


def _finding_out(converter: cattrs.Converter, finding: Finding) -> dict[str, Any]:
    if isinstance(finding, RawFinding):
        data: dict[str, Any] = json.loads(finding.data)
        return data
    fields = converter.unstructure(finding, unstructure_as=type(finding))
    clash = set(_RESERVED) & set(fields)
    if clash:
        raise TypeError(f"{type(finding).__name__} may not have fields named {sorted(clash)}")
    summary = {"verdict": finding.verdict, "actionable": finding.actionable, "reason": finding.reason()}
    return {"type": type(finding).__name__, **fields, "summary": summary}


def _finding_in(converter: cattrs.Converter, detector: str, data: object, known: type[Finding] | None) -> Finding:
    if not isinstance(data, dict) or not isinstance(data.get("fqn"), str):
        raise TypeError("a finding must be an object with a string 'fqn'")
    if known is None or data.get("type") != known.__name__:
        return RawFinding(
            fqn=data["fqn"], detector=detector, data=json.dumps(data, allow_nan=False, default=standalone)
        )
    fields = {k: v for k, v in data.items() if k not in _RESERVED}
    finding: Finding = converter.structure(fields, known)
    check_finding(finding)  # values each valid alone may still not make a finding (per-channel tuples of two lengths)
    return finding


def _register_results(converter: cattrs.Converter, *, strict: bool) -> None:
    unstructure_rest = make_dict_unstructure_fn(DetectorResult, converter, findings=override(omit=True))
    structure_rest = make_dict_structure_fn(
        DetectorResult, converter, findings=override(omit=True), _cattrs_forbid_extra_keys=strict
    )

    def result_out(result: DetectorResult) -> dict[str, Any]:
        data = unstructure_rest(result)
        data["findings"] = [_finding_out(converter, f) for f in result.findings]
        return data

    def result_in(data: object, _: object) -> DetectorResult:
        if not isinstance(data, dict) or not isinstance(data.get("findings", []), list):
            raise TypeError("a detector result must be an object with a list of findings")
        result = structure_rest({k: v for k, v in data.items() if k != "findings"}, DetectorResult)
        known = finding_type(result.detector)
        findings = []
        for index, item in enumerate(data.get("findings", [])):
            try:
                findings.append(_finding_in(converter, result.detector, item, known))
            except Exception as exc:
                hint = tuple[Finding, ...]
                raise _at_field(_at_index(exc, index, hint, Finding), "findings", DetectorResult, hint) from None
        return attrs.evolve(result, findings=tuple(findings))

    converter.register_unstructure_hook(DetectorResult, result_out)
    converter.register_structure_hook(DetectorResult, result_in)


STRICT = _converter(strict=True)
_LENIENT = _converter(strict=False)  # for files of a newer minor version: unknown fields are ignored
_PLAIN = _converter(strict=True, packed=False)  # every array a JSON list (save_report(..., packed=False))


# -- the file


def report_to_dict(report: Report, *, packed: bool = True) -> dict[str, Any]:
    """The report as the JSON value of its file; with ``packed``, long arrays as typed binary (:mod:`.arrays`)."""
    body: dict[str, Any] = (STRICT if packed else _PLAIN).unstructure(report)
    return {"format": FORMAT, "schema_version": list(SCHEMA_VERSION), **body}


def report_to_json(report: Report, *, packed: bool = True) -> str:
    """The report's file as text: with ``packed``, its arrays compacted (:func:`~.arrays.compacted`)."""
    data = report_to_dict(report, packed=packed)
    return json.dumps(compacted(data) if packed else data, allow_nan=False, indent=1) + "\n"


def save_report(
    report: Report,
    path: str | os.PathLike[str],
    *,
    packed: bool = True,
    compress: Compression | Literal["none"] | None = None,
) -> None:
    """Write ``report`` to ``path`` as JSON; the file is replaced whole or not at all.

    Args:
        report: the report to write.
        path: where; :func:`load_report` reads it back.
        packed: arrays of 16 values or more typed binary inside the JSON, losslessly; ``False``: every
            number a JSON number, for tools that read the file as plain JSON (about 3 times larger).
        compress: ``"xz"`` (about 4 times smaller again), ``"gzip"`` (3 times) or ``"none"``; default:
            what the name asks for (``.xz``, ``.gz``, else none).
    """
    if compress not in (None, "none", "gzip", "xz"):
        raise InvalidParameterError(
            "save_report", "compress", compress, "'xz', 'gzip', 'none' or None (by the file's name)"
        )
    text = report_to_json(report, packed=packed)
    kind = compression_of(path) if compress is None else (None if compress == "none" else compress)
    write_atomically(path, compressed(text, kind) if kind is not None else text)


def _version(data: dict[str, Any], source: str) -> tuple[int, int]:
    version = data.get("schema_version")
    if not (
        isinstance(version, list)
        and len(version) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in version)
    ):
        raise ReportFileError(source, f"schema_version must be [major, minor], not {version!r}", "$.schema_version")
    return version[0], version[1]


def _describe(exc: BaseException, expected: type | None) -> str:
    # cattrs' default says "invalid value for type, expected float" and drops why; keep the why.
    if isinstance(exc, (KeyError, cattrs.ForbiddenExtraKeysError)):
        return format_exception(exc, expected)
    name = getattr(expected, "__name__", None) or str(expected)
    return f"invalid {name}: {exc}"


def _first_error(exc: Exception) -> tuple[str, str | None]:
    """cattrs' error tree flattened to its first line, split into (problem, JSON path)."""
    if isinstance(exc, cattrs.BaseValidationError):
        lines = cattrs.transform_error(exc, path="$", format_exception=_describe)
    else:
        lines = [str(exc)]
    first = lines[0] if lines else str(exc)
    problem, _, location = first.rpartition(" @ ")
    return (problem, location) if problem else (first, None)


def report_from_dict(data: object, *, source: str = "<report>", max_bytes: int = MAX_BYTES) -> Report:
    """The report a file's JSON value holds. Its typed arrays are decoded in place (deflated ones to at
    most ``max_bytes`` in all)."""
    if not isinstance(data, dict):
        raise ReportFileError(source, f"the top level is {type(data).__name__}, not a JSON object", "$")
    if data.get("format") != FORMAT:
        raise ReportFileError(source, f"not a qinsight report: format is {data.get('format')!r}", "$.format")
    version = _version(data, source)
    if version[0] not in READABLE_MAJORS:
        raise ReportVersionError(source, version, SCHEMA_VERSION)
    converter = STRICT
    if version[0] == SCHEMA_VERSION[0] and version[1] > SCHEMA_VERSION[1]:
        warnings.warn(
            f"{source} was written with report schema {version[0]}.{version[1]}, newer than this qinsight's "
            f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}; fields it does not know are ignored",
            stacklevel=3,
        )
        converter = _LENIENT
    body = {k: v for k, v in data.items() if k not in ("format", "schema_version")}
    try:
        expanded(body, max_bytes)
    except ArrayError as exc:
        raise ReportFileError(source, exc.problem, exc.path) from None
    try:
        report: Report = converter.structure(body, Report)
    except Exception as exc:  # cattrs wraps hook errors; anything else is a malformed file too
        problem, location = _first_error(exc)
        raise ReportFileError(source, problem, location) from None
    return report


def _no_constant(token: str) -> float:
    raise ValueError(f'{token} is not JSON (report files write non-finite numbers as "nan", "inf", "-inf")')


def _finite_number(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"the number {token[:40]} does not fit a float")
    return value


def report_from_json(text: str, *, source: str = "<string>", max_bytes: int = MAX_BYTES) -> Report:
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite_number)
    except json.JSONDecodeError as exc:
        raise ReportFileError(source, f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise ReportFileError(source, "not a report: JSON nested deeper than the parser allows") from None
    except ValueError as exc:  # NaN/Infinity tokens, overflowing floats, integers over Python's digit limit
        raise ReportFileError(source, f"not valid JSON: {exc}") from None
    return report_from_dict(data, source=source, max_bytes=max_bytes)


def load_report(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> Report:
    """Read a report file written by :func:`save_report`, compressed or not.

    Args:
        path: any file, pipe or device.
        max_bytes: read at most this many bytes, and decompress at most as many.

    Returns:
        The :class:`Report`; a finding of a detector not installed here is kept as a ``RawFinding``.

    Raises:
        ReportFileError: the file is not a report, or a field of it is wrong (its JSON path named).
        ReportVersionError: written by a schema of another major version.
    """
    source = os.fspath(path)
    try:
        text = decompressed(read_capped(source, max_bytes), max_bytes).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportFileError(source, f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ReportFileError(source, exc.strerror or str(exc)) from None
    except ValueError as exc:
        raise ReportFileError(source, str(exc)) from None
    return report_from_json(text, source=source, max_bytes=max_bytes)
