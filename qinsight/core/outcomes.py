"""What quantizing one config for real gives: its score, or the flow's failure to build or run it.

A plan tries hundreds of configs and a verification a handful; a flow that cannot build or run one
of them (a kernel missing for an op, a shape it cannot trace) must not end the work, and must not
pass for a score either. :class:`FailedConfig` is that outcome, typed: it carries the flow's error,
ranks below every score in either direction (:meth:`~qinsight.core.metrics.MetricSpec.worse`),
meets no target, and a record shows it as not measured (:func:`measured`) with its error said.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import attrs


@attrs.frozen
class FailedConfig:
    """A config the flow could not build or run, and the flow's error in one line."""

    error: str


Outcome: TypeAlias = float | FailedConfig  # a score compares in its metric's direction (MetricSpec.worse)


def measured(outcome: Outcome) -> float:
    """``outcome`` as a record's number: its score, NaN (not measured) for a failure."""
    return math.nan if isinstance(outcome, FailedConfig) else outcome


__all__ = ["FailedConfig", "Outcome", "measured"]
