"""attrs validators that raise :class:`InvalidParameterError` naming the detector."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import attrs

from qinsight.errors import InvalidParameterError

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def in_open_interval(low: float, high: float) -> Validator:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not (isinstance(value, (int, float)) and math.isfinite(value) and low < value < high):
            raise InvalidParameterError(type(instance).__name__, attribute.name, value, f"a number in ({low}, {high})")

    return check


def one_of(choices: Collection[str]) -> Validator:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value not in choices:
            raise InvalidParameterError(
                type(instance).__name__, attribute.name, value, "one of " + ", ".join(sorted(choices))
            )

    return check
