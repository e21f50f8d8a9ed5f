"""The stages of :func:`qinsight.plan`, each a function returning a frozen record of what it measured.

1. :func:`baseline`: the flow's default config quantized for real and scored; in FX, the report's
   activation observing measured against torch's (kept where it scores no worse).
2. :func:`subject`: what the plan quantizes: the model as given, or smoothed first
   (``smoothing=True``, :mod:`.smoothing_search`) and diagnosed again.
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

from qinsight.apply.smoothed_model import apply_smoothing
from qinsight.apply.trial import Trial, weight_counts, weighted_layers
from qinsight.core.errors import FrontendError, MissingExtraError, describe
from qinsight.core.fx_activations import FxActivations
from qinsight.core.metrics import worse
from qinsight.core.notes import Note, NoteKind
from qinsight.core.plan import PlanStep, SearchedOrder, SiteSensitivity, SuggestionCheck
from qinsight.core.progress import Progress
from qinsight.core.report import Report
from qinsight.core.sites import OpKind, OpSite
from qinsight.core.smoothing import SmoothingMapping
from qinsight.core.suggestions import QuantSuggestion
from qinsight.core.verification import SuggestionKind
from qinsight.planning.checks import Measuring, RealScore, check_all, is_default
from qinsight.planning.request import PlanRequest
from qinsight.planning.scores import Scorer
from qinsight.planning.search import Noise, Search, choose_order, measure_dynamic_noise
from qinsight.planning.simulate import Run
from qinsight.planning.simulated_flows import Flow, flow_for
from qinsight.planning.smoothing_search import choose_smoothing
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


class FailedConfigs:
    """The configs a flow could not build or run: each scores the worst there is, so no stage can choose
    it and the search goes on; the plan's notes say each distinct error once (no config kills a plan)."""

    def __init__(self) -> None:
        self._errors: dict[str, int] = {}

    def record(self, trial: Trial) -> None:
        self._errors[trial.error] = self._errors.get(trial.error, 0) + 1

    def notes(self, flow: str) -> tuple[Note, ...]:
        return tuple(
            Note(
                NoteKind.FAILED_CONFIGS,
                f"{count} candidate config{'s' if count > 1 else ''} the {flow} flow could not build or run, "
                f"left out: {error}",
            )
            for error, count in self._errors.items()
        )


def real_score(flow: Flow, request: PlanRequest, scorer: Scorer, failed: FailedConfigs) -> RealScore:
    """A config's score quantized for real through ``flow`` (:meth:`Flow.trial`: prepare, calibrate,
    convert, run); the worst score there is where the flow cannot build or run it (a metric's own error
    is not caught)."""
    worst = -math.inf if request.higher_is_better else math.inf

    def score(advice: tuple[QuantSuggestion, ...]) -> float:
        found = flow.trial(advice, request.calibration, request.evaluation)
        if found.failed:
            failed.record(found)
            return worst
        return scorer(list(found.outputs))

    return score


@attrs.frozen
class Subject:
    """What the plan quantizes: ``model`` (smoothed by ``smoothing``, if it smooths), its ``report``,
    the ``flow`` that quantizes it, and the configs that flow ``failed`` to build or run."""

    model: nn.Module
    report: Report
    smoothing: SmoothingMapping
    flow: Flow
    failed: FailedConfigs

    def real(self, request: PlanRequest, scorer: Scorer) -> RealScore:
        """A config's score quantized for real through the flow (:func:`real_score`)."""
        return real_score(self.flow, request, scorer, self.failed)


@attrs.frozen
class Checked:
    """The calibrated simulation and its search, the suggestions' checks, the modes the search starts
    from and the suggestions kept."""

    search: Search
    checks: tuple[SuggestionCheck, ...]
    start: dict[str, Mode]
    kept: tuple[QuantSuggestion, ...]


@attrs.frozen
class Sensitivity:
    """Each candidate's sensitivity, the noises the search orders sites by, and the all-quantized
    and all-float runs later runs start from."""

    sites: tuple[SiteSensitivity, ...]
    noise: Noise
    dynamic_noise: Noise
    quantized_run: Run
    float_run: Run


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


def baseline(request: PlanRequest, model: nn.Module, report: Report, scorer: Scorer, failed: FailedConfigs) -> Baseline:
    """The flow's default config for real (where the flow cannot build or run even that, the plan ends
    here, in one error); where the flow observes activations the report's way (FX), that too, kept if it
    scores no worse (a check saying so either way)."""
    default = _flow(request, model, report.sites)
    score = _score(default, request, scorer)
    activations = default.observing(report.fx_activations)
    if activations is None:
        return Baseline(default, score, default, (), score)
    candidate = _flow(request, model, report.sites, activations)
    observed = real_score(candidate, request, scorer, failed)(())
    kept = not worse(observed, score, request.higher_is_better)
    check = SuggestionCheck(
        fqn="",
        change=activations.describe(),
        kinds=(SuggestionKind.ACTIVATIONS,),
        before=score,
        alone=observed,
        kept=kept,
        reason="measured for real (prepare, calibrate, convert)"
        if kept
        else f"not applied: {observed - score:+.3g} on the output against torch's default observing, measured for real",
        why=NoteKind.MEASURED_REAL if kept else NoteKind.HURTS,
    )
    return Baseline(default, score, candidate if kept else default, (check,), observed if kept else score)


def subject(
    request: PlanRequest, model: nn.Module, report: Report, base: Baseline, failed: FailedConfigs, progress: Progress
) -> Subject:
    """The model the plan quantizes: with ``smoothing``, the Linears' inputs smoothed where that lowers
    their measured error, the smoothed model diagnosed again and a flow of its own."""
    if not request.smoothing:
        return Subject(model, report, SmoothingMapping(), base.chosen, failed)
    from qinsight.pipeline import diagnose
    from qinsight.pipeline.saturation import kernels_checked

    progress("smoothing the Linears' inputs", 0, 1)
    linears = [site.fqn for site in report.sites if site.kind is OpKind.LINEAR]
    mapping = choose_smoothing(model, list(request.calibration), linears, base.chosen.smoothing_bits())
    if not mapping.entries:
        return Subject(model, report, mapping, base.chosen, failed)
    smoothed = apply_smoothing(model, mapping)
    again = diagnose(smoothed, list(request.calibration), deploy=request.backend, verify=False)
    if base.chosen.activations is not None:
        again = kernels_checked(smoothed, again, request.calibration[0])
    observing = again.fx_activations if base.chosen.activations is not None else None  # the smoothed model's own check
    flow = _flow(request, smoothed, again.sites, observing)
    return Subject(smoothed, again, mapping, flow, failed)


def checked(request: PlanRequest, chosen: Subject, base: Baseline, scorer: Scorer, progress: Progress) -> Checked:
    """The simulation calibrated and its search set up; each report suggestion measured (:mod:`.checks`)."""
    progress("calibrating the simulation", 0, 1)
    sim = chosen.flow.simulation(list(request.calibration))
    names = {site.fqn for site in chosen.report.sites}
    # the smoothing's divisions stay float, unsearched: quantized, they would quantize the factors per tensor
    divisions = {site: Mode.FLOAT for site in chosen.smoothing.divisions if site in sim.sites}
    candidates = [site for site in sim.sites if site in names and site not in divisions]
    kinds = {site.fqn: site.kind.value for site in chosen.report.sites}
    parameters = weight_counts(chosen.model, candidates)
    search = Search(sim, scorer, candidates, parameters, kinds, progress, divisions, request.higher_is_better)
    default = {**{site: Mode.STATIC for site in candidates}, **divisions}
    real = chosen.real(request, scorer)
    start_score = base.start_score if not chosen.smoothing.entries else real(())
    applicable, decided = _applicable(request, chosen.report.suggestions, start_score)
    measuring = Measuring(
        sim, lambda run: scorer(run.outputs), real, list(request.evaluation), request.higher_is_better
    )
    checks, start, kept = check_all(measuring, applicable, default, chosen.flow.spec, start_score)
    return Checked(search, base.checks + checks + decided, start, kept)


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


def sensitivity(request: PlanRequest, found: Checked) -> Sensitivity:
    """Each site alone in float and alone quantized; the noise of each alone quantized, per order the
    search can take (:attr:`Scorer.orders`), and dynamically for the Linears that start static."""
    search, start, evaluation = found.search, found.start, list(request.evaluation)
    sim, scorer = search.sim, search.scorer
    quantized_run = sim.run(start, evaluation)
    everything_float = search.everything_float()
    float_run = sim.run(everything_float, evaluation)
    all_quantized = scorer(quantized_run.outputs)
    sites: list[SiteSensitivity] = []
    noise: Noise = {order: {} for order in scorer.orders}
    for done, site in enumerate(search.candidates):
        search.progress("measuring sensitivity", done, len(search.candidates))
        float_only = scorer(sim.run_changed({**start, site: Mode.FLOAT}, quantized_run).outputs)
        quantized_mode = start[site] if start[site] is not Mode.FLOAT else Mode.STATIC
        alone = sim.run_changed({**everything_float, site: quantized_mode}, float_run).outputs
        for order, value in scorer.noise(alone).items():
            noise[order][site] = value
        sites.append(
            SiteSensitivity(
                fqn=site,
                kind=search.kinds.get(site, ""),
                parameters=search.parameters[site],
                float_only=float_only,
                quantized_only=scorer(alone),
                gain=float_only - all_quantized,
            )
        )
    # on top of the user's quantizer no Linear is made dynamic: the quantizer decides that
    fixed = request.quantizer is not None
    dynamic_noise = {order: {} for order in noise} if fixed else measure_dynamic_noise(search, start, float_run, noise)
    return Sensitivity(tuple(sites), noise, dynamic_noise, quantized_run, float_run)


def searched(request: PlanRequest, found: Checked, measured: Sensitivity) -> Searched:
    """The curve and its refinement, in each order the noise was measured in (:func:`.search.choose_order`)."""
    steps, modes, orders = choose_order(
        found.search,
        request.goal,
        found.start,
        measured.float_run,
        measured.quantized_run,
        measured.noise,
        measured.dynamic_noise,
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


def converted(
    request: PlanRequest,
    flow: Flow,
    advice: tuple[QuantSuggestion, ...],
    report: Report,
    held_out: Scorer | None = None,
) -> Converted:
    """What ``flow`` really quantizes of ``advice``'s config, over every layer of ``report`` (prepare,
    calibrate, convert, then the converted model's layers read: quantized modules in FX, weights
    dequantized in the PT2E graph), and that converted model's score on the held-out data."""
    found = flow.trial(advice, request.calibration, request.held_out if held_out is not None else ())
    if found.failed:
        raise FrontendError(f"the {flow.name} flow cannot quantize the plan's config again: {found.error}")
    held = held_out(list(found.outputs)) if held_out is not None else math.nan
    weighted = weighted_layers(flow.model, report.sites)
    total = sum(weighted.values())
    fraction = sum(n for fqn, n in weighted.items() if fqn in found.quantized) / total if total else 1.0
    kept = {s.fqn for s in advice if s.keep_float}
    return Converted(fraction, found.left_float(fqn for fqn in weighted if fqn not in kept), held)


def _score(flow: Flow, request: PlanRequest, scorer: Scorer) -> float:
    """The flow's config without suggestions, quantized for real: what every plan starts from."""
    found = flow.trial((), request.calibration, request.evaluation)
    if isinstance(found.failure, (FrontendError, MissingExtraError)):
        raise found.failure
    if found.failure is not None:
        raise FrontendError(
            f"the {flow.name} flow's default config cannot quantize and run {type(flow.model).__name__} on these "
            f"calibration and evaluation batches, and every plan starts from it: {describe(found.failure)}"
        ) from found.failure
    return scorer(list(found.outputs))


__all__ = [
    "Baseline",
    "Checked",
    "Converted",
    "FailedConfigs",
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
