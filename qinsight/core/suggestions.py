"""Per-module quantization suggestions and how detectors' opinions merge.

Each detector gives partial opinions (a field left ``None`` means "no
opinion"). :func:`merge_suggestions` combines them per module. When detectors
disagree on a field, the choice that keeps more accuracy wins (dynamic over
static activations, per-channel over per-tensor weights, equalizing over not,
keeping a module in float over quantizing it). The rule does not depend on the
order detectors ran in, and every disagreement is recorded as a
:class:`SuggestionConflict` in the report rather than resolved silently.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final, TypeVar

import attrs

from qinsight.core.sites import WeightScheme


class ActivationMode(enum.Enum):
    STATIC = "static"
    DYNAMIC = "dynamic"


FieldValue = TypeVar("FieldValue", ActivationMode, WeightScheme, bool)

# Per field, the values from most to least accurate: the first one any
# detector asks for wins a conflict.
ACTIVATION_RANKING: Final = (ActivationMode.DYNAMIC, ActivationMode.STATIC)
WEIGHT_RANKING: Final = (WeightScheme.PER_CHANNEL, WeightScheme.PER_TENSOR)
FLAG_RANKING: Final = (True, False)


@attrs.frozen(kw_only=True)
class QuantSuggestion:
    """How to quantize module ``fqn``; ``None`` fields carry no opinion."""

    fqn: str
    activation: ActivationMode | None = None
    weight: WeightScheme | None = None
    equalize: bool | None = None
    keep_float: bool | None = None
    sources: tuple[str, ...] = ()

    @property
    def changes_nothing(self) -> bool:
        """Whether it holds no opinion that changes a config (what :meth:`describe` calls "no change")."""
        return not self.keep_float and self.activation is None and self.weight is None and not self.equalize

    def describe(self) -> str:
        """``activation dynamic, weight per_channel`` — the opinions it holds."""
        if self.keep_float:
            return "keep in float"
        if self.changes_nothing:
            return "no change"
        parts = []
        if self.activation is not None:
            parts.append(f"activation {self.activation.value}")
        if self.weight is not None:
            parts.append(f"weight {self.weight.value}")
        if self.equalize:
            parts.append("equalize")
        return ", ".join(parts)


@attrs.frozen(kw_only=True)
class Opinion:
    detector: str
    value: str


@attrs.frozen(kw_only=True)
class SuggestionConflict:
    """Detectors disagreed on one field of one module's suggestion."""

    fqn: str
    field: str
    opinions: tuple[Opinion, ...]
    chosen: str


def _value_name(value: ActivationMode | WeightScheme | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else value.value


def _choose(
    fqn: str,
    field: str,
    opinions: list[tuple[QuantSuggestion, FieldValue]],
    ranking: tuple[FieldValue, ...],
    conflicts: list[SuggestionConflict],
) -> FieldValue | None:
    if not opinions:
        return None
    chosen = min((value for _, value in opinions), key=ranking.index)
    if len({value for _, value in opinions}) > 1:
        conflicts.append(
            SuggestionConflict(
                fqn=fqn,
                field=field,
                opinions=tuple(Opinion(detector=",".join(s.sources), value=_value_name(v)) for s, v in opinions),
                chosen=_value_name(chosen),
            )
        )
    return chosen


def _merge_one(fqn: str, group: list[QuantSuggestion], conflicts: list[SuggestionConflict]) -> QuantSuggestion:
    def flags(name: str) -> list[tuple[QuantSuggestion, bool]]:
        return [(s, v) for s in group if (v := getattr(s, name)) is not None]

    return QuantSuggestion(
        fqn=fqn,
        activation=_choose(
            fqn,
            "activation",
            [(s, s.activation) for s in group if s.activation is not None],
            ACTIVATION_RANKING,
            conflicts,
        ),
        weight=_choose(
            fqn, "weight", [(s, s.weight) for s in group if s.weight is not None], WEIGHT_RANKING, conflicts
        ),
        equalize=_choose(fqn, "equalize", flags("equalize"), FLAG_RANKING, conflicts),
        keep_float=_choose(fqn, "keep_float", flags("keep_float"), FLAG_RANKING, conflicts),
        sources=tuple(sorted({source for s in group for source in s.sources})),
    )


def merge_suggestions(
    suggestions: Iterable[QuantSuggestion],
) -> tuple[tuple[QuantSuggestion, ...], tuple[SuggestionConflict, ...]]:
    """One suggestion per module (in first-seen order) and the conflicts met."""
    by_fqn: dict[str, list[QuantSuggestion]] = {}
    for suggestion in suggestions:
        by_fqn.setdefault(suggestion.fqn, []).append(suggestion)
    conflicts: list[SuggestionConflict] = []
    merged = tuple(_merge_one(fqn, group, conflicts) for fqn, group in by_fqn.items())
    return merged, tuple(conflicts)
