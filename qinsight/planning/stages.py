"""The stages of :func:`qinsight.plan`, each a function returning a frozen record of what it measured.

Each takes the plan's :class:`~qinsight.planning.plan_run.PlanRun` (what the stages share: the request,
the scorer, the failures, the search) and returns plain values.

1. :func:`baseline`: the flow's default config quantized for real and scored; in FX, the report's
   activation observing measured against torch's (kept where it scores no worse).
2. :func:`subject`: what the plan quantizes: the model as given, or smoothed first
   (``smoothing=True``, :mod:`.smoothing_search`) and diagnosed again; :func:`corrected`: its biases
   corrected where the corrected default scores better (``bias_correction=True``).
3. :func:`checked`: the simulation calibrated, and each report suggestion measured alone and among
   the others (:mod:`.checks`).
4. :func:`sensitivity`: per candidate site, the score with only it in float and with only it
   quantized, and the noise it adds alone (static, and dynamic for Linears).
5. :func:`searched`: the quality-vs-fraction curve and its refinement (:mod:`.search`).
6. :func:`verified` (:mod:`.verify`): the config quantized for real.
"""

from __future__ import annotations

import math

import attrs
from torch import nn

from qinsight.apply.bias_correction import measure_bias_correction
from qinsight.apply.corrected_model import apply_bias_correction
from qinsight.apply.smoothed_model import apply_smoothing
from qinsight.apply.trial import measuring, model_outputs, weighted_layers
from qinsight.core.bias import BiasCorrection
from qinsight.core.errors import FrontendError, MissingExtraError, describe
from qinsight.core.fx_activations import FxActivations
from qinsight.core.notes import Note, NoteKind
from qinsight.core.outcomes import FailedConfig, Outcome, measured
from qinsight.core.plan import PlanStep, SearchedOrder, SiteSensitivity, SuggestionCheck
from qinsight.core.report import Report
from qinsight.core.sites import OpKind, OpSite
from qinsight.core.smoothing import SmoothingMapping
from qinsight.core.suggestions import QuantSuggestion
from qinsight.core.verification import SuggestionKind
from qinsight.planning.checks import Measuring, check_all, is_default
from qinsight.planning.plan_run import PlanRun
from qinsight.planning.request import PlanRequest
from qinsight.planning.scores import Scorer
from qinsight.planning.search import Noise, choose_order, measure_dynamic_noise
from qinsight.planning.simulated_flows import Flow, flow_for
from qinsight.planning.smoothing_search import choose_smoothing
from qinsight.planning.sweep import sweep
from qinsight.planning.switches import Mode


@attrs.frozen
class Baseline:
    """The flow's default config (``flow``, scored ``score`` for real) and the flow the plan builds on
    (``chosen``: with the report's activation observing where ``checks`` kept it; ``start_score``)."""

    flow: Flow
    score: float
    chosen: Flow
    checks: tuple[SuggestionCheck, ...]
    start_score: float


@attrs.frozen
class Subject:
    """What the plan quantizes: ``model`` (smoothed by ``smoothing``, if it smooths; its biases
    corrected by ``bias_correction``, if that scored better: ``checks`` say so), its ``report``, and the
    ``flow`` that quantizes it."""

    model: nn.Module
    report: Report
    smoothing: SmoothingMapping
    flow: Flow
    bias_correction: BiasCorrection = BiasCorrection()
    checks: tuple[SuggestionCheck, ...] = ()


@attrs.frozen
class Checked:
    """The suggestions' checks, the modes the search starts from and the suggestions kept (the
    calibrated simulation is the run's: :attr:`PlanRun.search`)."""

    checks: tuple[SuggestionCheck, ...]
    start: dict[str, Mode]
    kept: tuple[QuantSuggestion, ...]


@attrs.frozen
class Sensitivity:
    """Each candidate's sensitivity, and the noises the search orders sites by."""

    sites: tuple[SiteSensitivity, ...]
    noise: Noise
    dynamic_noise: Noise


@attrs.frozen
class Searched:
    """The search's steps (the curve), the mode each site ends in, and the orders it compared."""

    steps: tuple[PlanStep, ...]
    modes: dict[str, Mode]
    orders: tuple[SearchedOrder, ...]


def _flow(
    request: PlanRequest, model: nn.Module, sites: tuple[OpSite, ...], activations: FxActivations | None = None
) -> Flow:
    """The request's flow for ``model`` (scored lowered, started from the user's quantizer, as asked)."""
    scoring = (request.lowering, request.quantizer)
    return flow_for(request.flow, model, sites, request.backend, request.everything, activations, *scoring)


def baseline(run: PlanRun, report: Report) -> Baseline:
    """The flow's default config for real (where the flow cannot build or run even that, the plan ends
    here, in one error); where the flow observes activations the report's way (FX), that too, kept if it
    scores no worse (a check saying so either way)."""
    default = _flow(run.request, run.model, report.sites)
    score = _score(default, run)
    activations = default.observing(report.fx_activations)
    if activations is None:
        return Baseline(default, score, default, (), score)
    candidate = _flow(run.request, run.model, report.sites, activations)
    observed = run.real(candidate, ())
    kept = not run.spec.worse(observed, score)
    why, reason = (NoteKind.MEASURED_REAL, "measured for real (prepare, calibrate, convert)")
    if isinstance(observed, FailedConfig):
        why, reason = NoteKind.FLOW_CANNOT_RUN, f"not applied: with it the flow cannot build or run: {observed.error}"
    elif not kept:
        why = NoteKind.HURTS
        reason = (
            f"not applied: {observed - score:+.3g} on the output against torch's default observing, measured for real"
        )
    check = SuggestionCheck(
        fqn="",
        change=activations.describe(),
        kinds=(SuggestionKind.ACTIVATIONS,),
        before=score,
        alone=measured(observed),
        kept=kept,
        reason=reason,
        why=why,
    )
    return Baseline(default, score, candidate if kept else default, (check,), measured(observed) if kept else score)


def subject(run: PlanRun, report: Report, base: Baseline) -> Subject:
    """The model the plan quantizes: with ``smoothing``, the Linears' inputs smoothed where that lowers
    their measured error, the smoothed model diagnosed again and a flow of its own."""
    request, model = run.request, run.model
    if not request.smoothing:
        return Subject(model, report, SmoothingMapping(), base.chosen)
    from qinsight.pipeline import diagnose
    from qinsight.pipeline.saturation import kernels_checked

    run.progress("smoothing the Linears' inputs", 0, 1)
    linears = [site.fqn for site in report.sites if site.kind is OpKind.LINEAR]
    mapping = choose_smoothing(model, list(request.calibration), linears, base.chosen.smoothing_bits())
    if not mapping.entries:
        return Subject(model, report, mapping, base.chosen)
    smoothed = apply_smoothing(model, mapping)
    again = diagnose(smoothed, list(request.calibration), deploy=request.backend, verify=False)
    if base.chosen.activations is not None:
        again = kernels_checked(smoothed, again, request.calibration[0])
    observing = again.fx_activations if base.chosen.activations is not None else None  # the smoothed model's own check
    flow = _flow(request, smoothed, again.sites, observing)
    return Subject(smoothed, again, mapping, flow)


def corrected(run: PlanRun, chosen: Subject) -> Subject:
    """``chosen`` with the default config's biases corrected (:mod:`qinsight.apply.bias_correction`, measured
    on the calibration batches from its converted model) where the corrected default scores better for
    real; a check saying so either way. Every layer stays int8: a better start keeps fewer sites float."""
    request = run.request
    run.progress("correcting the biases", 0, 1)
    with measuring():
        try:
            correction = measure_bias_correction(
                chosen.model, chosen.flow.advice(()), list(request.calibration), chosen.flow.quantizer
            )
        except Exception:  # the default converted a moment ago: a flow failing now leaves nothing to correct
            return chosen
    run.progress("correcting the biases", 1, 1)
    if not correction.entries:
        return chosen
    model = apply_bias_correction(chosen.model, correction)
    flow = _flow(request, model, chosen.report.sites, chosen.flow.activations)
    before, after = run.real(chosen.flow, ()), run.real(flow, ())
    kept = run.spec.worse(before, after)  # a config the flow cannot run is worse than any score
    why, reason = (NoteKind.MEASURED_REAL, "measured for real (prepare, calibrate, convert)")
    if not kept:
        why, reason = NoteKind.HURTS, f"not applied: {_said(after)} with the biases corrected, {_said(before)} without"
    check = SuggestionCheck(
        fqn="",
        change=f"biases corrected in {len(correction)} layers",
        kinds=(SuggestionKind.BIAS_CORRECTION,),
        before=measured(before),
        alone=measured(after),
        kept=kept,
        reason=reason,
        why=why,
    )
    if not kept:
        return attrs.evolve(chosen, checks=(*chosen.checks, check))
    return attrs.evolve(chosen, model=model, flow=flow, bias_correction=correction, checks=(*chosen.checks, check))


def _said(outcome: Outcome) -> str:
    return f"cannot run ({outcome.error})" if isinstance(outcome, FailedConfig) else f"{outcome:.4g}"


def checked(run: PlanRun, chosen: Subject, base: Baseline) -> Checked:
    """The simulation calibrated and the run's search set up; each report suggestion measured (:mod:`.checks`)."""
    kinds = {site.fqn: site.kind.value for site in chosen.report.sites}
    # the smoothing's divisions stay float, unsearched: quantized, they would quantize the factors per tensor
    search = run.calibrated(chosen.flow, chosen.model, kinds, chosen.smoothing.divisions)
    default = {**{site: Mode.STATIC for site in search.candidates}, **search.fixed}
    real = run.real_score(chosen.flow)
    start_score = base.start_score if chosen.flow is base.chosen else measured(real(()))
    applicable, decided = _applicable(run.request, chosen.report.suggestions, start_score)
    measuring = Measuring(search, real)
    checks, start, kept = check_all(measuring, applicable, default, chosen.flow.spec, start_score)
    return Checked(base.checks + chosen.checks + checks + decided, start, kept)


def _applicable(
    request: PlanRequest, suggestions: tuple[QuantSuggestion, ...], before: float
) -> tuple[tuple[QuantSuggestion, ...], tuple[SuggestionCheck, ...]]:
    """The suggestions a plan can apply: all of them, or on top of the user's quantizer only the sites
    kept in float (the quantizer decides weight schemes and dynamic activations), the others said."""
    if request.quantizer is None:
        return suggestions, ()
    name = type(request.quantizer).__name__
    decided = tuple(
        SuggestionCheck.of(
            s,
            before=before,
            alone=math.nan,
            kept=False,
            reason=f"not applied: the plan starts from your {name}, which decides this",
            why=NoteKind.YOURS_DECIDES,
        )
        for s in suggestions
        if not s.keep_float and not is_default(s)
    )
    return tuple(s for s in suggestions if s.keep_float), decided


def sensitivity(run: PlanRun, found: Checked) -> Sensitivity:
    """Each site alone in float and alone quantized; the noise of each alone quantized, per order the
    search can take (:attr:`Scorer.orders`), and dynamically for the Linears that start static."""
    search, start = run.search, found.start
    sim, scorer, candidates, evaluation = search.sim, search.scorer, search.candidates, search.batches
    everything_float = search.everything_float()

    def measuring(done: int, total: int) -> None:
        search.progress("measuring sensitivity", done, total)

    each_float = [{**start, site: Mode.FLOAT} for site in candidates]
    all_quantized, float_only = sweep(sim, start, each_float, evaluation, scorer, progress=measuring)
    each_quantized = [{**everything_float, site: _quantized(start[site])} for site in candidates]
    alone = sweep(sim, everything_float, each_quantized, evaluation, scorer.with_noise, progress=measuring)[1]
    noise: Noise = {order: {site: found[1][order] for site, found in zip(candidates, alone)} for order in scorer.orders}
    sites = tuple(
        SiteSensitivity(
            fqn=site,
            kind=search.kinds.get(site, ""),
            parameters=search.parameters[site],
            float_only=floated,
            quantized_only=quantized[0],
            gain=floated - all_quantized,
        )
        for site, floated, quantized in zip(candidates, float_only, alone)
    )
    # on top of the user's quantizer no Linear is made dynamic: the quantizer decides that
    fixed = run.request.quantizer is not None
    dynamic_noise = {order: {} for order in noise} if fixed else measure_dynamic_noise(search, start, noise)
    return Sensitivity(sites, noise, dynamic_noise)


def _quantized(mode: Mode) -> Mode:
    """The mode a site takes quantized alone: the one it starts in, static for a site starting in float."""
    return mode if mode is not Mode.FLOAT else Mode.STATIC


def searched(run: PlanRun, found: Checked, measured: Sensitivity) -> Searched:
    """The curve and its refinement, in each order the noise was measured in (:func:`.search.choose_order`)."""
    steps, modes, orders = choose_order(
        run.search, run.request.goal, found.start, measured.noise, measured.dynamic_noise
    )
    return Searched(steps, modes, orders)


@attrs.frozen
class Converted:
    """The plan's config as the flow converts it, read from the converted model: the share of the layers'
    parameters whose weights it quantizes, and the layers it leaves in float that the config quantizes."""

    fraction: float
    left_float: tuple[str, ...]
    held_out: float = math.nan  # the converted model scored on the held-out data (NaN: none given)

    def notes(self, flow: str) -> tuple[Note, ...]:
        if not self.left_float:
            return ()
        if self.fraction == 0.0:
            said = f"the {flow} flow quantizes none of this model's layers: {', '.join(self.left_float)} stay in float"
        else:
            said = f"the {flow} flow leaves in float what the config quantizes: {', '.join(self.left_float)}"
        return (Note(NoteKind.LEFT_FLOAT, said),)


def converted(run: PlanRun, flow: Flow, advice: tuple[QuantSuggestion, ...], report: Report) -> Converted:
    """What ``flow`` really quantizes of ``advice``'s config, over every layer of ``report`` (read from
    the converted model: quantized modules in FX, weights dequantized in the PT2E graph), and that
    converted model's score on the held-out data: the verification's measurement of the config, which
    ran the held-out batches too (quantized again only where it did not: the default returned)."""
    request, ranks = run.request, run.ranks
    found = run.measured(flow, advice, held_out=True)
    if isinstance(found.outcome, FailedConfig):
        raise FrontendError(f"the {flow.name} flow cannot quantize the plan's config again: {found.outcome.error}")
    held = math.nan
    if request.held_out and found.held_out is not None:  # the float model's held-out outputs only now
        reference = ranks.gathered(model_outputs(run.model, run.held_out))
        scorer = Scorer(reference, request.metric, request.metric_name, request.held_out, ranks.gather)
        held = scorer(list(found.held_out))
    weighted = weighted_layers(flow.model, report.sites)
    total = sum(weighted.values())
    fraction = sum(n for fqn, n in weighted.items() if fqn in found.quantized) / total if total else 1.0
    kept = {s.fqn for s in advice if s.keep_float}
    left = tuple(fqn for fqn in weighted if fqn not in kept and fqn not in found.quantized)
    return Converted(fraction, left, held)


def _score(flow: Flow, run: PlanRun) -> float:
    """The flow's config without suggestions, quantized for real: what every plan starts from."""
    found = run.measured(flow, ())
    if isinstance(found.failure, (FrontendError, MissingExtraError)):
        raise found.failure
    if isinstance(found.outcome, FailedConfig):
        said = describe(found.failure) if found.failure is not None else found.outcome.error  # another rank's
        raise FrontendError(
            f"the {flow.name} flow's default config cannot quantize and run {type(flow.model).__name__} on these "
            f"calibration and evaluation batches, and every plan starts from it: {said}"
        ) from found.failure
    return found.outcome


__all__ = [
    "Baseline",
    "Checked",
    "Converted",
    "Searched",
    "Sensitivity",
    "Subject",
    "baseline",
    "checked",
    "converted",
    "searched",
    "sensitivity",
    "subject",
]
