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
eye; readers take both forms. Decoding needs no more memory than the text it
comes from: the bytes are the base64 text's, never decompressed.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any, Final

import numpy as np

SHORTEST: Final = 16
FLOAT_KINDS: Final = {"f4": "<f4", "f8": "<f8"}
INT_KINDS: Final = {
    name: f"<{name}" for name in ("u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8")
}
_KEYS: Final = {"array", "n", "base64"}


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


def is_packed(value: object) -> bool:
    """Whether a JSON value is a typed array (an object), rather than a list."""
    return isinstance(value, dict)


def _unpacked(value: dict[str, Any], kinds: dict[str, str]) -> np.ndarray[Any, Any]:
    if set(value) != _KEYS:
        raise TypeError(f"a typed array has exactly the keys {sorted(_KEYS)}, not {sorted(value)}")
    kind, count, text = value["array"], value["n"], value["base64"]
    if kind not in kinds:
        raise TypeError(f"a typed array of this field is one of {', '.join(kinds)}, not {kind!r}")
    if type(count) is not int or count < SHORTEST:
        raise TypeError(f"a typed array's n is a whole number of at least {SHORTEST}, not {count!r}")
    if not isinstance(text, str):
        raise TypeError(f"a typed array's base64 is a string, not {type(text).__name__}")
    dtype = np.dtype(kinds[kind])
    if len(text) != 4 * math.ceil(count * dtype.itemsize / 3):  # checked before decoding anything
        raise TypeError(f"a typed array of {count} {kind} values has {4 * math.ceil(count * dtype.itemsize / 3)} base64 characters, not {len(text)}")
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise TypeError(f"a typed array's base64 does not decode: {exc}") from None
    return np.frombuffer(raw, dtype=dtype)


def floats_in(value: dict[str, Any]) -> tuple[float, ...]:
    """The floats of a typed array; every NaN the one ``math.nan`` (reports compare equal)."""
    values = _unpacked(value, FLOAT_KINDS).astype("<f8")
    if not np.isnan(values).any():  # the common case: numpy's tolist gives the Python floats at once
        return tuple(values.tolist())
    return tuple(math.nan if x != x else x for x in values.tolist())


def ints_in(value: dict[str, Any]) -> tuple[int, ...]:
    return tuple(_unpacked(value, INT_KINDS).tolist())


__all__ = ["SHORTEST", "floats_in", "floats_out", "ints_in", "ints_out", "is_packed"]
