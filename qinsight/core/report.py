"""The Report: everything one diagnosis found, as immutable values.

A Report holds no tensors, modules or dicts: only frozen attrs classes,
tuples, strings, numbers and enums, so it can be compared, saved and diffed.
The torch configs are built from it by :mod:`qinsight.apply` (``qinsight.qconfig_mapping(report)``),
the text and the files by :mod:`qinsight.outputs` (``qinsight.to_text``, ``qinsight.save_report``):
this module knows neither.
"""

from __future__ import annotations

import collections
import enum
import math
from collections.abc import Mapping

import attrs

from qinsight.core.comparison import Comparison
from qinsight.core.equalization import EqualizationMapping, EqualizationRefusal
from qinsight.core.errors import InvalidValueError, NotFoundError
from qinsight.core.findings import Finding
from qinsight.core.formats import FormatPlan
from qinsight.core.fx_activations import FxActivations
from qinsight.core.plan import QuantPlan
from qinsight.core.sites import OpSite, Side, called_module
from qinsight.core.stats import Observation
from qinsight.core.suggestions import QuantSuggestion, SuggestionConflict
from qinsight.core.verification import ConfigVerification, SuggestionKind

ParameterValue = bool | int | float | str


def _finite(_instance: object, _attribute: object, value: ParameterValue) -> None:
    # A non-finite float would read back as the string "nan"/"inf" (the file's encoding of them).
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError(f"a parameter value must be finite, not {value}")


@attrs.frozen(kw_only=True)
class Parameter:
    """One parameter a detector ran with, recorded for the file and the reader."""

    name: str
    value: ParameterValue = attrs.field(validator=_finite)


@attrs.frozen(kw_only=True)
class DetectorResult:
    """What one detector concluded: its findings and its suggestions."""

    detector: str
    parameters: tuple[Parameter, ...] = ()
    findings: tuple[Finding, ...] = ()
    suggestions: tuple[QuantSuggestion, ...] = ()

    def parameter(self, name: str) -> ParameterValue:
        for parameter in self.parameters:
            if parameter.name == name:
                return parameter.value
        raise NotFoundError(f"parameter of detector {self.detector}", name, (p.name for p in self.parameters))

    def finding(self, fqn: str) -> Finding:
        for finding in self.findings:
            if finding.fqn == fqn:
                return finding
        raise NotFoundError(f"finding of detector {self.detector} for module", fqn, (f.fqn for f in self.findings))


class FailureStage(enum.Enum):
    LOAD = "load"
    INSERT_POINTS = "insert_points"
    ANALYZE = "analyze"


@attrs.frozen(kw_only=True)
class DetectorFailure:
    """A detector that failed; the other detectors' results still stand."""

    detector: str
    stage: FailureStage
    error: str


@attrs.frozen(kw_only=True)
class ReportMetadata:
    model: str
    frontend: str
    backend: str
    batches: int = attrs.field(validator=attrs.validators.ge(0))
    qinsight_version: str
    torch_version: str


@attrs.frozen(kw_only=True)
class Report:
    """The result of :func:`qinsight.diagnose`."""

    metadata: ReportMetadata
    sites: tuple[OpSite, ...]
    observations: tuple[Observation, ...]
    results: tuple[DetectorResult, ...]
    suggestions: tuple[QuantSuggestion, ...]
    conflicts: tuple[SuggestionConflict, ...] = ()
    equalization_mapping: EqualizationMapping = EqualizationMapping()
    failures: tuple[DetectorFailure, ...] = ()
    comparison: Comparison | None = None
    plan: QuantPlan | None = None
    # how the FX config observes activations (None: torch's default way; absent in files before 1.11)
    fx_activations: FxActivations | None = None
    # a torchao format per Linear (qinsight.plan_formats; absent in files before 2.1)
    formats: FormatPlan | None = None
    # the report's config quantized for real per flow, kinds of suggestion that hurt dropped (absent before 2.2)
    verification: tuple[ConfigVerification, ...] = ()

    def __attrs_post_init__(self) -> None:
        for what, names in (
            ("site", [s.fqn for s in self.sites]),
            ("observation key", [o.key for o in self.observations]),
            ("detector result", [r.detector for r in self.results]),
        ):
            repeated = sorted(n for n, count in collections.Counter(names).items() if count > 1)
            if repeated:
                raise InvalidValueError(f"each {what} may appear once; repeated: {', '.join(repeated[:5])}")

    def with_comparison(self, comparison: Comparison) -> Report:
        """This report carrying ``comparison`` (float vs quantized), to save and show together."""
        return attrs.evolve(self, comparison=comparison)

    def with_plan(self, plan: QuantPlan) -> Report:
        """This report carrying ``plan`` (:func:`qinsight.plan`), to save and show together.

        The plan's verified config becomes the report's config for the plan's
        flow (:func:`qinsight.core.advice.advice_of`), and an equalization the plan measured and
        dropped leaves the report's equalization mapping with the plan's reason:
        the report then applies only what was verified, or could not be.
        """
        measured_and_dropped = {
            check.fqn: check.reason
            for check in plan.checks
            # measured: quantized for real with and without it (a flow without equalization measures none)
            if SuggestionKind.EQUALIZE in check.kinds and check.measured and not check.kept
        }
        return attrs.evolve(self.with_equalization_refused(measured_and_dropped), plan=plan)

    def with_formats(self, plan: FormatPlan) -> Report:
        """This report carrying ``plan`` (:func:`qinsight.plan_formats`), to save and show together."""
        return attrs.evolve(self, formats=plan)

    def with_verification(self, verdicts: tuple[ConfigVerification, ...]) -> Report:
        """This report carrying ``verdicts`` (:func:`qinsight.verify_report`), one per flow; an
        equalization they drop leaves the equalization mapping with their reason (only FX equalizes)."""
        reasons = {
            fqn: check.reason
            for verdict in verdicts
            for check in verdict.checks
            if check.kind is SuggestionKind.EQUALIZE and not check.kept
            for fqn in self.equalization_mapping.fqns
        }
        return attrs.evolve(self.with_equalization_refused(reasons), verification=verdicts)

    def verification_for(self, flow: str) -> ConfigVerification | None:
        """The verdict on the report's config in ``flow``; ``None`` where it was not verified there."""
        return next((v for v in self.verification if v.flow == flow), None)

    def with_equalization_refused(self, reasons: Mapping[str, str]) -> Report:
        """This report with the equalizations named in ``reasons`` (fqn to why) refused: out of the
        mapping and of their suggestions (one that said nothing else is dropped), kept with the reason."""
        mapping = self.equalization_mapping
        refused = tuple(
            EqualizationRefusal(fqn=entry.fqn, reason=reasons[entry.fqn], sources=entry.sources)
            for entry in mapping.entries
            if entry.fqn in reasons
        )
        if not refused:
            return self
        kept = tuple(entry for entry in mapping.entries if entry.fqn not in reasons)
        suggestions = tuple(attrs.evolve(s, equalize=None) if s.fqn in reasons else s for s in self.suggestions)
        return attrs.evolve(
            self,
            suggestions=tuple(s for s in suggestions if not s.changes_nothing),
            equalization_mapping=EqualizationMapping(entries=kept, refused=mapping.refused + refused),
        )

    def result(self, detector: str) -> DetectorResult:
        for result in self.results:
            if result.detector == detector:
                return result
        raise NotFoundError("result of detector", detector, (r.detector for r in self.results))

    def suggestion(self, fqn: str) -> QuantSuggestion:
        """The merged suggestion for ``fqn``; :class:`NotFoundError` where nothing was suggested for it."""
        found = next((s for s in self.suggestions if s.fqn == fqn), None)
        if found is None:
            raise NotFoundError("suggestion for", fqn, (s.fqn for s in self.suggestions))
        return found

    def observation(self, fqn: str, side: Side) -> Observation:
        """What was observed at ``side`` of site ``fqn`` (a later call's weight: its module's)."""
        fqn = called_module(fqn) if side is Side.WEIGHT else fqn
        found = next((o for o in self.observations if o.fqn == fqn and o.side is side), None)
        if found is None:
            raise NotFoundError("observation", f"{fqn}:{side.value}", (o.key for o in self.observations))
        return found

    def actionable(self) -> tuple[Finding, ...]:
        return tuple(f for r in self.results for f in r.findings if f.actionable)
