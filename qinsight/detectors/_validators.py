"""attrs validators that raise :class:`InvalidParameterError` naming the detector."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from qinsight.core.backend import check_backend
from qinsight.core.errors import InvalidParameterError

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def in_open_interval(low: float, high: float, *, closed_high: bool = False) -> Validator:
    """A finite number in (low, high), or (low, high] with ``closed_high``."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        number = _number(value)
        if number is None or not (low < number and (number <= high if closed_high else number < high)):
            expected = f"a number in ({low}, {high}{']' if closed_high else ')'}"
            raise InvalidParameterError(type(instance).__name__, attribute.name, value, expected)

    return check


def positive(*, minimum: float) -> Validator:
    """A finite number at least ``minimum`` (and above 0)."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        number = _number(value)
        if number is None or number < minimum or number <= 0.0:
            raise InvalidParameterError(
                type(instance).__name__, attribute.name, value, f"a finite number >= {minimum} and > 0"
            )

    return check


def installed_backend() -> Validator:
    """The name of a backend installed here (:func:`~qinsight.core.backend.backend_names`: metadata only)."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str):
            raise InvalidParameterError(type(instance).__name__, attribute.name, value, "a backend's name")
        check_backend(type(instance).__name__, value)

    return check


def positive_or_none(*, minimum: float) -> Validator:
    """``None``, or what :func:`positive` accepts."""
    check_number = positive(minimum=minimum)

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None:
            check_number(instance, attribute, value)

    return check
