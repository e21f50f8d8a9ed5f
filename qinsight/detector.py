"""The contract every detector implements, built-in or third-party.

A detector is a small object with an ``id`` (``vendor.name``), the detector
``api_version`` it was written against, the ``finding_type`` of its findings
(so report files can be read back), and two methods: ``insert_points``
says what to observe, ``analyze`` turns the frozen statistics into a
:class:`~qinsight.report.DetectorResult`. Built-in detectors are frozen attrs
classes whose fields are their parameters; :func:`parameters_of` records them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast, runtime_checkable

import attrs

from qinsight.findings import Finding
from qinsight.report import DetectorResult, Parameter
from qinsight.sites import InsertPoint
from qinsight.suggestions import QuantSuggestion
from qinsight.stats import ObservedStats

if TYPE_CHECKING:
    from qinsight.frontends.base import ModelView

API_VERSION = 1


@runtime_checkable
class Detector(Protocol):
    id: ClassVar[str]
    api_version: ClassVar[int]
    finding_type: ClassVar[type[Finding]]

    def insert_points(self, view: ModelView) -> Sequence[InsertPoint]:
        """What to observe; an empty sequence for detectors that only read weights or qconfigs."""
        ...

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        """The findings and suggestions, from the calibrated statistics."""
        ...


def parameters_of(detector: object) -> tuple[Parameter, ...]:
    """The parameters of an attrs-class detector, as report values (enums by value)."""
    if not attrs.has(type(detector)):
        return ()
    values = []
    for field in attrs.fields(cast(Any, type(detector))):
        value = getattr(detector, field.name)
        if isinstance(value, enum.Enum):
            value = value.value
        if isinstance(value, (bool, int, float, str)):
            values.append(Parameter(name=field.name, value=value))
    return tuple(values)


def result_of(
    detector: Detector, findings: Iterable[Finding], suggestions: Iterable[QuantSuggestion]
) -> DetectorResult:
    """The result of ``detector``, with its id and parameters recorded."""
    return DetectorResult(
        detector=detector.id,
        parameters=parameters_of(detector),
        findings=tuple(findings),
        suggestions=tuple(suggestions),
    )
