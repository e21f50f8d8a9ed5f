"""Per-channel arrays in report files as typed binary, losslessly.

A report of an LLM holds a few numbers per channel of every observed tensor
(minima, maxima, sums, counts), and as JSON lists they made most of a file:
about 200 bytes per channel, 56 MB for four 7B-width layers. An array of
:data:`SHORTEST` values or more is written instead as one JSON object::

    {"array": "f4", "n": 4096, "base64": "AACAPwAAAEA..."}

its values little-endian in the narrowest type that holds every one of them
exactly: ``f4`` where each float round-trips through float32 (the minima and
maxima of float32 activations do), else ``f8``; the narrowest unsigned or
signed integer type for counts. Shorter arrays stay JSON lists, readable by
eye; readers take both forms.

A file holds its arrays in a smaller form still (schema 3.0, :func:`compacted`):
an array met before in the file, values and type, is a reference to it
(``{"array": "f8", "n": 4096, "same": 17}``: the 18th array holding values, in
the order the file's text lists them), and an array whose bytes deflate is
``{"array": "f8", "n": 4096, "deflate": "eJzt..."}``: its byte planes (every
value's first byte, then every second byte...: the exponents of floats lie
together) deflated (zlib). Both are lossless. A report repeats arrays: an
outlier finding carries its input's tail statistics, and the sums of float32
values are float64 whose high bytes vary little. :func:`expanded` reads them
back; what they decode to is bounded by the caller's budget, whatever the
file claims, and a reference shares its target's values (no copy). A long tuple
of enum members (per-channel statuses) is its levels and a typed array of codes
(:func:`enums_out`).
"""

from __future__ import annotations

import base64
import binascii
import enum
import math
import zlib
from collections.abc import Iterator
from typing import Any, Final, TypeVar

import numpy as np

SHORTEST: Final = 16
FLOAT_KINDS: Final = {"f4": "<f4", "f8": "<f8"}
INT_KINDS: Final = {name: f"<{name}" for name in ("u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8")}
# the forms a file may hold an array in: its values (base64), deflated, or a reference to an earlier one
_FORMS: Final = ("base64", "deflate", "same")


def _packed(kind: str, values: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {"array": kind, "n": int(values.size), "base64": base64.b64encode(values.tobytes()).decode("ascii")}


def floats_out(values: tuple[float, ...]) -> dict[str, Any] | None:
    """``values`` as a typed array, or ``None`` where a JSON list serves (fewer than :data:`SHORTEST`)."""
    if len(values) < SHORTEST:
        return None
    wide = np.asarray(values, dtype="<f8")
    with np.errstate(over="ignore"):  # a float32 overflow is what the check below refuses
        narrow = wide.astype("<f4")
    exact = np.array_equal(narrow.astype("<f8"), wide, equal_nan=True)
    return _packed("f4", narrow) if exact else _packed("f8", wide)


def ints_out(values: tuple[int, ...]) -> dict[str, Any] | None:
    """``values`` as the narrowest integer array holding them, or ``None`` where a JSON list serves
    (short, or beyond 64 bits)."""
    if len(values) < SHORTEST:
        return None
    low, high = min(values), max(values)
    for name, dtype in INT_KINDS.items():
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return _packed(name, np.asarray(values, dtype=dtype))
    return None


class Decoded:
    """A typed array read from a file: its type name and values. Its tuple is made once, so the
    references to it share it (a file of references costs no more memory than its text)."""

    __slots__ = ("_items", "kind", "values")

    def __init__(self, kind: str, values: np.ndarray[Any, Any]) -> None:
        self.kind, self.values = kind, values
        self._items: tuple[Any, ...] | None = None

    def items(self, kinds: dict[str, str]) -> tuple[Any, ...]:
        if self.kind not in kinds:
            raise TypeError(f"a typed array of this field is one of {', '.join(kinds)}, not {self.kind!r}")
        if self._items is None:
            self._items = _floats(self.values) if kinds is FLOAT_KINDS else tuple(self.values.tolist())
        return self._items


_E = TypeVar("_E", bound=enum.Enum)
_ENUM_KEYS: Final = {"array", "n", "levels", "codes"}


def enums_out(values: tuple[enum.Enum, ...]) -> dict[str, Any] | None:
    """A per-channel tuple of enum members (an outlier finding's channel statuses) as its distinct values
    in order of appearance and each value's index among them, a typed array; ``None`` where a JSON list
    serves (fewer than :data:`SHORTEST`). As a list, 4,096 statuses took 25 KB a finding."""
    if len(values) < SHORTEST:
        return None
    levels: dict[Any, int] = {}
    codes = tuple(levels.setdefault(member.value, len(levels)) for member in values)
    return {"array": "enum", "n": len(values), "levels": list(levels), "codes": ints_out(codes)}


def enums_in(value: object, kind: type[_E]) -> tuple[_E, ...]:
    """The members an :func:`enums_out` object stands for, each level a value of ``kind``."""
    if not isinstance(value, dict) or set(value) != _ENUM_KEYS or value["array"] != "enum":
        raise TypeError(
            f"an array of {kind.__name__} is a list or an object with the keys {', '.join(sorted(_ENUM_KEYS))} and "
            "array 'enum'"
        )
    levels = value["levels"]
    if not isinstance(levels, list) or len(set(map(repr, levels))) != len(levels):
        raise TypeError(f"an array of {kind.__name__} has a list of distinct levels, not {str(levels)[:60]}")
    try:
        members = [kind(level) for level in levels]
    except ValueError:
        raise TypeError(
            f"an array of {kind.__name__} has levels among {', '.join(repr(m.value) for m in kind)}, not "
            f"{str(levels)[:60]}"
        ) from None
    codes = ints_in(value["codes"]) if is_packed(value["codes"]) else None
    if codes is None or len(codes) != value["n"] or (codes and not 0 <= min(codes) <= max(codes) < len(members)):
        raise TypeError(
            f"an array of {kind.__name__} has n codes, a typed array of indices into its {len(members)} levels"
        )
    return tuple(members[code] for code in codes)


def standalone(value: object) -> dict[str, Any]:
    """A decoded array in the form that stands alone (``base64``): ``json.dumps``' ``default`` where a
    part of a file is kept as text (a finding of a detector not installed), since a reference in it would
    name an array outside it."""
    if not isinstance(value, Decoded):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return _packed(value.kind, value.values)


def is_packed(value: object) -> bool:
    """Whether a JSON value is a typed array (an object, or one :func:`expanded` decoded), rather than a list."""
    return isinstance(value, (dict, Decoded))


def _count(value: dict[str, Any], kinds: dict[str, str], form: str) -> tuple[str, int, np.dtype[Any]]:
    if set(value) != {"array", "n", form}:
        raise TypeError(
            f"a typed array has exactly the keys array, n and one of {', '.join(_FORMS)}, not "
            f"{', '.join(map(repr, sorted(value)))}"
        )
    kind, count = value["array"], value["n"]
    if kind not in kinds:
        raise TypeError(f"a typed array's type is one of {', '.join(kinds)}, not {kind!r}")
    if type(count) is not int or count < SHORTEST:
        raise TypeError(f"a typed array's n is a whole number of at least {SHORTEST}, not {count!r}")
    return kind, count, np.dtype(kinds[kind])


def _base64(value: dict[str, Any], key: str) -> bytes:
    text = value[key]
    if not isinstance(text, str):
        raise TypeError(f"a typed array's {key} is a base64 string, not {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: a character that is not ASCII
        raise TypeError(f"a typed array's {key} does not decode: {exc}") from None


def _unpacked(value: dict[str, Any], kinds: dict[str, str]) -> np.ndarray[Any, Any]:
    """The values of an array written with ``base64``, checked before anything is decoded."""
    kind, count, dtype = _count(value, kinds, "base64")
    text = value["base64"]
    if isinstance(text, str) and len(text) != 4 * math.ceil(count * dtype.itemsize / 3):
        raise TypeError(
            f"a typed array of {count} {kind} values has {4 * math.ceil(count * dtype.itemsize / 3)} base64 "
            f"characters, not {len(text)}"
        )
    raw = _base64(value, "base64")
    if len(raw) != count * dtype.itemsize:  # the right length of text, but padded otherwise
        raise TypeError(
            f"a typed array of {count} {kind} values decodes to {len(raw)} bytes, not {count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype)


def _inflated(value: dict[str, Any], kinds: dict[str, str], budget: list[int]) -> np.ndarray[Any, Any]:
    """The values of a ``deflate`` array: at most the bytes its ``n`` says, taken from ``budget``."""
    kind, count, dtype = _count(value, kinds, "deflate")
    size = count * dtype.itemsize
    if size > budget[0]:
        raise TypeError(f"the file's typed arrays decode to more than the {budget[1]}-byte limit (max_bytes=)")
    budget[0] -= size
    stream = zlib.decompressobj()
    try:
        planes = stream.decompress(_base64(value, "deflate"), size)
    except zlib.error as exc:
        raise TypeError(f"a typed array's deflate stream does not inflate: {exc}") from None
    if len(planes) != size or not stream.eof or stream.unconsumed_tail or stream.unused_data:
        raise TypeError(f"a typed array of {count} {kind} values inflates to other than {size} bytes")
    return np.frombuffer(planes, dtype=np.uint8).reshape(dtype.itemsize, count).T.copy().view(dtype).reshape(count)


def _floats(values: np.ndarray[Any, Any]) -> tuple[float, ...]:
    """The floats as Python floats; every NaN the one ``math.nan`` (reports compare equal)."""
    wide = values.astype("<f8")
    if not np.isnan(wide).any():  # the common case: numpy's tolist gives the Python floats at once
        return tuple(wide.tolist())
    return tuple(math.nan if x != x else x for x in wide.tolist())


def floats_in(value: dict[str, Any] | Decoded) -> tuple[float, ...]:
    """The floats of a typed array."""
    return value.items(FLOAT_KINDS) if isinstance(value, Decoded) else _floats(_unpacked(value, FLOAT_KINDS))


def ints_in(value: dict[str, Any] | Decoded) -> tuple[int, ...]:
    return value.items(INT_KINDS) if isinstance(value, Decoded) else tuple(_unpacked(value, INT_KINDS).tolist())


_ALL_KINDS: Final = {**FLOAT_KINDS, **INT_KINDS}


def _typed_arrays(tree: Any) -> Iterator[tuple[Any, Any, dict[str, Any], str]]:
    """Every typed array of a JSON tree, in the order its text lists them: (the object or list holding
    it, its key there, the array, its JSON path). Depth first with a stack of iterators, one per open
    object or list: memory grows with the nesting, which the parser bounds, not with the breadth (a
    file of 500,000 empty lists), and a plain file's millions of numbers are passed over."""
    if not isinstance(tree, (dict, list)):
        return
    stack: list[tuple[Any, str, Iterator[tuple[Any, Any]]]] = [(tree, "$", _items(tree))]
    while stack:
        holder, path, items = stack[-1]
        for key, child in items:
            if isinstance(child, dict) and _is_array(child):
                yield holder, key, child, _path(path, key)
            elif isinstance(child, (dict, list)):
                stack.append((child, _path(path, key), _items(child)))
                break
        else:
            stack.pop()


def _items(container: dict[str, Any] | list[Any]) -> Iterator[tuple[Any, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def _is_array(value: dict[str, Any]) -> bool:
    return len(value) == 3 and "array" in value and "n" in value and any(form in value for form in _FORMS)


def _path(path: str, key: Any) -> str:
    return f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"


def compacted(tree: Any) -> Any:
    """``tree`` (the JSON value of a report, its arrays written with ``base64``) with each array met
    before replaced by a reference, and each one whose byte planes deflate smaller written deflated."""
    first: dict[tuple[str, bytes], int] = {}  # an array's type and bytes -> its index among those holding values
    for holder, key, value, _ in _typed_arrays(tree):
        kind, raw = value["array"], base64.b64decode(value["base64"])
        known = first.get((kind, raw))
        if known is not None:
            holder[key] = {"array": kind, "n": value["n"], "same": known}
            continue
        first[(kind, raw)] = len(first)
        itemsize = np.dtype(_ALL_KINDS[kind]).itemsize
        planes = np.frombuffer(raw, dtype=np.uint8).reshape(-1, itemsize).T.tobytes()
        deflated = zlib.compress(planes, 9)
        if len(deflated) < len(raw):
            holder[key] = {"array": kind, "n": value["n"], "deflate": base64.b64encode(deflated).decode("ascii")}
    return tree


class ArrayError(TypeError):
    """A typed array of a file that cannot be read: what is wrong, and where (a JSON path)."""

    def __init__(self, problem: str, path: str) -> None:
        super().__init__(problem)
        self.problem, self.path = problem, path


def expanded(tree: Any, max_bytes: int) -> Any:
    """``tree`` (a report file's JSON value) with every typed array decoded (:class:`Decoded`), references
    resolved to the array they name; the deflated ones inflate to at most ``max_bytes`` in all."""
    arrays: list[Decoded] = []
    budget = [max_bytes, max_bytes]  # left, and the limit itself (for the message)
    for holder, key, value, path in _typed_arrays(tree):
        try:
            holder[key] = _decoded(value, arrays, budget)
        except TypeError as exc:
            raise ArrayError(str(exc), path) from None
    return tree


def _decoded(value: dict[str, Any], arrays: list[Decoded], budget: list[int]) -> Decoded:
    if "same" in value:
        kind, count, _ = _count(value, _ALL_KINDS, "same")
        index = value["same"]
        if type(index) is not int or not 0 <= index < len(arrays):
            raise TypeError(f"a typed array's same names one of the {len(arrays)} arrays before it, not {index!r}")
        target = arrays[index]
        if (target.kind, target.values.size) != (kind, count):
            raise TypeError(
                f"a typed array of {count} {kind} values refers to one of {target.values.size} {target.kind} values"
            )
        return target
    if "deflate" in value:
        decoded = Decoded(value["array"], _inflated(value, _ALL_KINDS, budget))
    else:
        decoded = Decoded(value["array"], _unpacked(value, _ALL_KINDS))
    arrays.append(decoded)
    return decoded


__all__ = [
    "SHORTEST",
    "ArrayError",
    "Decoded",
    "compacted",
    "expanded",
    "floats_in",
    "floats_out",
    "ints_in",
    "ints_out",
    "is_packed",
    "enums_in",
    "enums_out",
    "standalone",
]
