"""The report's own config, verified: quantized for real and scored before the report offers it.

The detectors judge each module from its statistics alone; whether their
suggestions help *together* depends on the model, the flow and the data (torch's
equalization takes the built-in conv-BN ``cnn`` 12 dB below the FX default; a
config may not even run). So :func:`qinsight.diagnose` quantizes the flow's
default config and the report's config for real, each kind of suggestion left
out once, and offers the best config it measured, the kinds it leaves out
dropped with their numbers (issue: advice that cannot hurt). The default is one
of the candidates: a report never offers a config that scored below it.

Here are only the results: :class:`KindCheck` (one kind of suggestion, with
and without it) and :class:`ConfigVerification` (one flow's verdict).
:func:`without_kinds` strips kinds from a config's inputs; :func:`kinds_of`
names those a config holds. Both are used by :func:`qinsight.core.advice.advice_of`,
which applies a report's verification to the config it builds.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection

import attrs

from qinsight.core.bias import BiasCorrection
from qinsight.core.equalization import EqualizationMapping
from qinsight.core.fx_activations import FxActivations
from qinsight.core.notes import Note, NoteKind
from qinsight.core.sites import FlowName, WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion


class SuggestionKind(enum.Enum):
    """A kind of change the report's config makes to the flow's default: verified together."""

    KEEP_FLOAT = "keep in float"
    DYNAMIC = "dynamic activations"
    PER_TENSOR = "per-tensor weights"
    EQUALIZE = "input-weight equalization"
    ACTIVATIONS = "activation observing"  # FX: 8 bits, clip-aware (FxActivations)
    BIAS_CORRECTION = "bias correction"  # the offered config's biases corrected (core.bias): checked last


def _strip(suggestion: QuantSuggestion, kinds: Collection[SuggestionKind]) -> QuantSuggestion:
    return attrs.evolve(
        suggestion,
        keep_float=None if SuggestionKind.KEEP_FLOAT in kinds and suggestion.keep_float else suggestion.keep_float,
        activation=None
        if SuggestionKind.DYNAMIC in kinds and suggestion.activation is ActivationMode.DYNAMIC
        else suggestion.activation,
        weight=None
        if SuggestionKind.PER_TENSOR in kinds and suggestion.weight is WeightScheme.PER_TENSOR
        else suggestion.weight,
        equalize=None if SuggestionKind.EQUALIZE in kinds and suggestion.equalize else suggestion.equalize,
    )


def suggestion_kinds(suggestion: QuantSuggestion) -> tuple[SuggestionKind, ...]:
    """The kinds of change one suggestion makes (a module kept in float makes only that one)."""
    if suggestion.keep_float:
        return (SuggestionKind.KEEP_FLOAT,)
    found = []
    if suggestion.activation is ActivationMode.DYNAMIC:
        found.append(SuggestionKind.DYNAMIC)
    if suggestion.weight is WeightScheme.PER_TENSOR:
        found.append(SuggestionKind.PER_TENSOR)
    if suggestion.equalize:
        found.append(SuggestionKind.EQUALIZE)
    return tuple(found)


@attrs.frozen
class ConfigParts:
    """What a config changes against the flow's default: the suggestions, the FX activation observing
    and the equalizations (:class:`qinsight.core.advice.Advice` holds the same fields)."""

    suggestions: tuple[QuantSuggestion, ...]
    fx_activations: FxActivations | None
    equalization: EqualizationMapping


def kinds_of(parts: ConfigParts) -> tuple[SuggestionKind, ...]:
    """The kinds of change ``parts`` make, in :class:`SuggestionKind` order."""
    found = {kind for s in parts.suggestions for kind in suggestion_kinds(s)}
    if parts.fx_activations is not None:
        found.add(SuggestionKind.ACTIVATIONS)
    if not parts.equalization.entries:
        found.discard(SuggestionKind.EQUALIZE)  # a suggested equalization torch refused changes nothing
    return tuple(kind for kind in SuggestionKind if kind in found)


def without_kinds(parts: ConfigParts, kinds: Collection[SuggestionKind]) -> ConfigParts:
    """``parts`` without the changes of ``kinds``: those suggestions' fields back to the default, a
    suggestion left saying nothing dropped."""
    if not kinds:
        return parts
    stripped = (_strip(s, kinds) for s in parts.suggestions)
    return ConfigParts(
        suggestions=tuple(s for s in stripped if not s.changes_nothing),
        fx_activations=None if SuggestionKind.ACTIVATIONS in kinds else parts.fx_activations,
        equalization=EqualizationMapping(refused=parts.equalization.refused)
        if SuggestionKind.EQUALIZE in kinds
        else parts.equalization,
    )


@attrs.frozen(kw_only=True)
class KindCheck:
    """One kind of suggestion: how many modules it changes (``modules``; 1 for the activation
    observing), the score of the report's config ``without`` it, whether it was ``kept``, and why not:
    ``reason`` in words, ``why`` its kind (:attr:`~qinsight.core.notes.NoteKind.HURTS` or
    :attr:`~qinsight.core.notes.NoteKind.FLOW_CANNOT_RUN`)."""

    kind: SuggestionKind
    modules: int = attrs.field(validator=attrs.validators.ge(0))
    without: float
    kept: bool
    reason: str = ""
    why: NoteKind | None = None


@attrs.frozen(kw_only=True)
class ConfigVerification:
    """One flow's verdict on the report's config, each score the ``metric`` (SQNR of the model's
    outputs, dB) of the converted model on ``scored`` batches after calibrating on ``calibrated``
    others (``held_out``: the two parts are disjoint; with one batch it is scored on itself).

    ``default``: the flow's default config; ``suggested``: the report's config as the detectors said
    it; ``score``: the config the report now offers (the kinds in ``dropped`` left out); ``left_float``:
    what the flow left in float of it, read from the converted model. ``error``: the flow could not
    quantize the model with its default config, and nothing was verified. ``lowered``: the runtime
    that ran every score, where each config was scored as the program lowered from it. ``yours``: the
    user's own quantizer (``verify_report(quantizer=q)``, ``diagnose(deploy=q)``), scored the same
    way; ``yours_from`` names its class (``None`` and empty: none given). ``bias_correction``: the
    biases the offered config's quantized weights shift, measured on the calibrating batches from its
    converted model; the ``BIAS_CORRECTION`` check says whether the config with them scored better and
    is offered (:attr:`applied_bias_correction`).
    """

    flow: FlowName
    metric: str = "sqnr"
    default: float = math.nan
    suggested: float = math.nan
    score: float = math.nan
    checks: tuple[KindCheck, ...] = ()
    calibrated: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    scored: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    held_out: bool = False
    error: str = ""
    notes: tuple[Note, ...] = ()
    # layers with weights the offered config quantizes that the flow, as converted, left in float
    left_float: tuple[str, ...] = ()
    lowered: str = ""  # the runtime of the programs scored (verify_report(lowered=True)); empty: the reference
    yours: float | None = None
    yours_from: str = ""
    # measured from the offered config's converted model; applied where its check was kept
    bias_correction: BiasCorrection = BiasCorrection()

    @property
    def verified(self) -> bool:
        """Whether the config was quantized for real and scored (the flow could quantize the model)."""
        return not self.error

    @property
    def applied_bias_correction(self) -> BiasCorrection:
        """The bias correction the offered config applies: the measured one where it scored better."""
        kept = any(check.kind is SuggestionKind.BIAS_CORRECTION and check.kept for check in self.checks)
        return self.bias_correction if kept else BiasCorrection()

    @property
    def dropped(self) -> tuple[SuggestionKind, ...]:
        """The kinds of suggestion the config the report offers leaves out."""
        return tuple(check.kind for check in self.checks if not check.kept)

    def describe(self) -> str:
        """One line: the verdict with its numbers."""
        if self.error:
            return f"{self.flow}: not verified: {self.error}"
        where = (
            f"{self.scored} held-out batch{'es' if self.scored != 1 else ''}"
            if self.held_out
            else "the calibration batch"
        )
        dropped = "; dropped: " + ", ".join(kind.value for kind in self.dropped) if self.dropped else ""
        program = f" as lowered ({self.lowered})" if self.lowered else ""
        yours = f"your {self.yours_from} {_db(self.yours)}, " if self.yours is not None else ""
        return (
            f"{self.flow}: the report's config {_db(self.score)}{program} on {where} "
            f"({yours}the flow's default {_db(self.default)}, as suggested {_db(self.suggested)}){dropped}"
        )


def _db(value: float) -> str:
    if math.isfinite(value):
        return f"{value:.1f} dB"
    return "cannot run" if value == -math.inf else "the float output unchanged" if value == math.inf else "not measured"


__all__ = [
    "ConfigParts",
    "ConfigVerification",
    "KindCheck",
    "SuggestionKind",
    "kinds_of",
    "suggestion_kinds",
    "without_kinds",
]
