"""The contract every detector implements, built-in or third-party.

A detector is a small object with an ``id`` (``vendor.name``), the detector
``api_version`` it was written against, the ``finding_type`` of its findings
(so report files can be read back), and two methods: ``insert_points``
says what to observe, ``analyze`` turns the frozen statistics into a
:class:`~qinsight.core.report.DetectorResult`. Built-in detectors are frozen attrs
classes whose fields are their parameters; :func:`parameters_of` records them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast, runtime_checkable

import attrs

from qinsight.core.findings import Finding, check_finding
from qinsight.core.report import DetectorResult, Parameter
from qinsight.core.sites import InsertPoint, OpSite, Side
from qinsight.core.stats import ObservedStats
from qinsight.core.suggestions import QuantSuggestion

if TYPE_CHECKING:
    import torch
    from torch import nn

API_VERSION = 1

Detach = Callable[[], None]
"""What :meth:`ModelView.attach` returns: call it to stop observing."""


class ModelView(Protocol):
    """What detectors and the instrumenter may know of a model."""

    @property
    def frontend(self) -> str:
        """The frontend's name, recorded in the report ("fx", ...)."""
        ...

    @property
    def model(self) -> nn.Module:
        """The module calibration runs; observing it never changes its outputs."""
        ...

    @property
    def sites(self) -> tuple[OpSite, ...]:
        """The Linear/Conv sites (ops with a weight), in forward order."""
        ...

    @property
    def ops(self) -> tuple[OpSite, ...]:
        """The other op sites a flow quantizes around them (adds, matmuls, softmax, norms...), in forward
        order, those the flow leaves in float included (``quantized=False``); empty where the
        frontend could not run the model before calibration."""
        ...

    def site(self, fqn: str) -> OpSite:
        """The site named ``fqn``; ``KeyError`` naming the known sites otherwise."""
        ...

    def weight(self, fqn: str) -> torch.Tensor:
        """The float weight of the site ``fqn`` (detached)."""
        ...

    def attach(self, fqn: str, side: Side, observe: Callable[[torch.Tensor], object]) -> Detach:
        """Call ``observe`` with the activation at ``side`` of ``fqn`` on every call.

        Returns the function that detaches it again.
        """
        ...


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


def check_result(detector: Detector, result: object) -> DetectorResult:
    """``result`` if it is a :class:`DetectorResult` whose findings answer what every finding must.

    A plugin's result is checked where it enters the report, so a bad one is
    that detector's failure, not an error later in ``to_text``, ``save`` or the page.
    """
    if not isinstance(result, DetectorResult):
        raise TypeError(f"analyze() returned {type(result).__name__}, not a DetectorResult")
    for finding in result.findings:
        check_finding(finding)
    for suggestion in result.suggestions:
        if not isinstance(suggestion, QuantSuggestion):
            raise TypeError(f"a suggestion is {type(suggestion).__name__}, not a QuantSuggestion")
    return result
