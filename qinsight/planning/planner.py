"""``qinsight.plan``: from a diagnosis to a config that reaches a quality target, every step measured.

:func:`plan` reads as its stages (:mod:`.stages`, :mod:`.verify`): the arguments checked before
any forward (:mod:`.request`), the flow's default config for real (the baseline), the model the plan
quantizes (smoothed or not), the report's suggestions checked, each site's sensitivity, the search,
and the verification for real. Each stage returns a frozen record; whatever differs between flows
is the flow's (:mod:`.simulated_flows`), so another flow is one more :class:`~qinsight.planning.simulated_flows.Flow`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs
from torch import nn

from qinsight.core.bias import BiasCorrection
from qinsight.core.errors import InvalidParameterError
from qinsight.core.flows import check_flow_backend, flow_spec, reads_as_is, report_flow
from qinsight.core.fx_activations import FxActivations
from qinsight.core.notes import Note, NoteKind
from qinsight.core.options import Deployment, Goal, Repairs, Resources, options
from qinsight.core.plan import Budget, PlanPrograms, QuantPlan, StageTime, Target, float_islands
from qinsight.core.progress import Progress
from qinsight.core.report import Report
from qinsight.core.sites import OpSite
from qinsight.core.smoothing import SmoothingMapping
from qinsight.core.suggestions import QuantSuggestion
from qinsight.planning import stages, verify
from qinsight.planning.plan_run import PlanRun
from qinsight.planning.request import PlanRequest, plan_request
from qinsight.planning.scores import held_out_miss
from qinsight.planning.search import order_notes

T = TypeVar("T")


def _quiet(_stage: str, _done: int, _total: int) -> None:
    return None


def plan(
    model: nn.Module,
    calibration_data: Iterable[Any],
    evaluation_data: Iterable[Any],
    *,
    goal: Goal | str | Target | Budget | None = None,
    deploy: Deployment | str | object | None = None,
    report: Report | None = None,
    repairs: Repairs | None = None,
    held_out_data: Iterable[Any] | None = None,
    progress: Progress | None = None,
    resources: Resources | None = None,
    **former: Any,
) -> QuantPlan:
    """The sites to keep in float so that ``model``, quantized with ``flow``, reaches ``target`` on
    ``evaluation_data``, starting from the report's verified suggestions; verified by quantizing for real.

    Args:
        model: the float model; it is not changed.
        calibration_data: the batches each config is calibrated on.
        evaluation_data: the batches each config is scored on, none of them a calibration batch.
        goal: a :class:`~qinsight.core.options.Goal`, or its shorthand: a target (``"sqnr>=30"``, the
            default; ``"cosine>=0.995"``, ``"top1>=0.94"``; a plugin metric's by its name; a function
            ``Goal.metric`` named in the target, ``"accuracy>=0.98"``), or a budget (``"float<=N"``: the
            best score with at most N sites in float). ``Goal.metric``: a metric's name, or a function of
            (float outputs, quantized outputs); default the target's, SQNR for a budget.
            ``Goal.confidence``: with a ``top1`` target, the search and its verification hold the target
            at the lower end of Wilson's one-sided interval over the evaluation rows (``plan.confidence``).
        deploy: a :class:`~qinsight.core.options.Deployment`, or its shorthand (a backend's or a flow's
            name, or your PT2E quantizer). ``flow``: ``"fx"`` or ``"pt2e"``; default: the first serving
            the backend (FX for x86 and FX's engines, PT2E for ``"xnnpack"``; PT2E for a model FX cannot
            trace). ``backend``: default: the one your quantizer is for, else x86. ``lowered`` (PT2E):
            every real score is of the program lowered from the config as the user ships it (XNNPACK run
            by the ExecuTorch runtime, x86 compiled by inductor; ``plan.lowered`` names it); the search
            between them stays on the reference model; each input shape is lowered once per config.
            ``quantizer`` (PT2E: any torchao Quantizer, a ``ComposableQuantizer`` too): every config is
            it with the plan's float sites stripped after it annotates, so the plan only chooses what
            to keep in float (``plan.starts_from`` names it; apply with ``qinsight.pt2e_quantizer(plan,
            quantizer=q)`` or ``qinsight.quantize(model, plan, data, quantizer=q)``).
        report: the diagnosis to start from; default: :func:`qinsight.diagnose` on the calibration data.
        repairs: a :class:`~qinsight.core.options.Repairs`, what the plan changes in the model before it
            keeps anything in float. ``smoothing``: the inputs of the Linears whose measured error it lowers
            are smoothed first (:mod:`.smoothing_search`) and the plan is made for
            ``qinsight.smoothed(model, plan)``; its ``default_score`` stays that of the model as given.
            ``bias_correction``: the default config's biases corrected (:mod:`qinsight.apply.bias_correction`),
            kept where the corrected default scores better for real (a check says so either way): every
            layer stays int8, and the plan is made for ``qinsight.bias_corrected(model, plan)``, which
            ``qinsight.quantize`` applies itself. (``smoothing=True``: the former keyword, for one release.)
        held_out_data: batches the search never chose on: the config as converted is scored again on
            them (``held_out_score``), and ``reached`` holds only where they meet the target too.
        progress: called at each stage (the command line's progress line).
        resources: a :class:`~qinsight.core.options.Resources`: what the plan may use, which never changes
            the plan. ``memory_budget``: what the simulation may hold beyond one batch's values (default
            2 GiB; a number of bytes, or ``"2GB"``, ``"512MiB"``): configurations run batch by batch, so
            the values it holds are one batch's whatever the evaluation data; the outputs of the
            configurations scored together wait within the budget (else in turns, each one more
            forward), and the refinement holds its config's values for every batch where they fit (else
            it runs it again per window of steps). A larger budget buys speed. ``shard="distributed"``:
            called alike on every rank of an initialized process group (``torchrun``; gloo on CPUs,
            nccl on GPUs) with the same data, each rank runs its share of the evaluation and held-out
            batches (batch ``i`` is rank ``i % world_size``'s) and every score is of all of them
            (:mod:`.plan_ranks`): every rank returns the plan one process would, holding a share of the
            evaluation data's values; each rank calibrates on all the calibration batches.
        former: ``target=``, ``budget=``, ``metric=``, ``confidence=`` (now ``goal``'s), ``flow=``,
            ``backend=``, ``lowered=``, ``quantizer=`` (now ``deploy``'s) and ``memory_budget=`` (now
            ``resources``'), for one release, with a ``DeprecationWarning``.

    Returns:
        The :class:`QuantPlan`: the sites kept in float, its verified score and whether it reached the
        target, each report suggestion's check, each site's sensitivity and the steps of the search.

    Raises:
        InvalidParameterError: an argument outside what it takes (among them too few rows for
            ``confidence``, naming how many), checked before the model runs.
    """
    chosen_repairs, former = _repairs(repairs, former)
    chosen_goal, deployment, resources = options(
        "plan", goal, deploy, former, budget_unit="float", takes=("goal", "deploy", "resources"), resources=resources
    )
    request = plan_request(
        goal=chosen_goal,
        deploy=deployment,
        calibration_data=calibration_data,
        evaluation_data=evaluation_data,
        smoothing=chosen_repairs.smoothing,
        bias_correction=chosen_repairs.bias_correction,
        held_out_data=held_out_data,
        resources=resources,
    )
    progress = progress or _quiet
    from qinsight.pipeline import diagnose
    from qinsight.pipeline.saturation import kernels_checked

    diagnosis: tuple[StageTime, ...] = ()
    if report is None:
        began = time.perf_counter()
        report = diagnose(model, list(request.calibration), deploy=request.backend, verify=False)  # the plan verifies
        diagnosis = (StageTime(stage="diagnosis", seconds=time.perf_counter() - began),)
    if deployment.flow is None and not reads_as_is(
        report.metadata.frontend
    ):  # FX cannot trace it: the flow that exports it
        request = attrs.evolve(request, flow=report_flow(report.metadata.frontend, request.backend))
        check_flow_backend("plan", request.flow, request.backend)  # as plan_request checks a flow given
    if flow_spec(request.flow).observes_activations:  # the FX config's kernels, checked as a verification checks them
        report = kernels_checked(model, report, request.calibration[0])
    run = PlanRun(request, model, progress)
    base = run.timed("baseline", stages.baseline, run, report)
    if request.lowering is not None:
        run.timed("float program", run.float_program)
    chosen = (
        run.timed("smoothing", stages.subject, run, report, base)
        if request.smoothing
        else stages.subject(run, report, base)
    )
    if request.bias_correction:
        chosen = run.timed("bias correction", stages.corrected, run, chosen)
    found = run.timed("checks", stages.checked, run, chosen, base)
    measured = run.timed("sensitivity", stages.sensitivity, run, found)
    search = run.timed("search", stages.searched, run, found, measured)
    # each config verified runs the held-out batches too: the one it ends with is not quantized again;
    # a bisection over lowered programs searches on the reference models first (no lowering)
    probe = run.real_score(chosen.flow.unlowered()) if request.lowering is not None else None
    verifying = (run.real_score(chosen.flow, held_out=True), run.request.goal, run.spec, found, search, base.score)
    real = run.timed("verification", verify.verified, *verifying, probe)
    final = base.flow if real.default else chosen.flow
    applied = run.timed("converted", stages.converted, run, final, real.suggestions, chosen.report)
    return attrs.evolve(_assembled(run, base, chosen, measured, search, real, applied), cost=run.cost(diagnosis))


def _repairs(repairs: Repairs | None, former: dict[str, Any]) -> tuple[Repairs, dict[str, Any]]:
    """``repairs`` as a record, and the former keywords left for the other records: ``smoothing=`` is
    the repairs', warned of."""
    if "smoothing" not in former:
        return Repairs.of(repairs, "plan"), former
    if repairs is not None:
        expected = "None beside smoothing= (one or the other)"
        raise InvalidParameterError("plan", "repairs", type(repairs).__name__, expected)
    warnings.warn(
        "plan(smoothing=...) is now plan(repairs=...): qinsight.types.Repairs(smoothing=...); the keyword goes "
        "in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    rest = {keyword: value for keyword, value in former.items() if keyword != "smoothing"}
    return Repairs(smoothing=former["smoothing"]), rest


def _untimed(_stage: str, step: Callable[..., T], *args: Any) -> T:
    """``step(*args)``, not a stage of the plan's cost (the model as given: nothing to time)."""
    return step(*args)


def _assembled(
    run: PlanRun,
    base: stages.Baseline,
    chosen: stages.Subject,
    measured: stages.Sensitivity,
    search: stages.Searched,
    real: verify.Verified,
    applied: stages.Converted,
) -> QuantPlan:
    """The stages' records as one :class:`QuantPlan` (the default config's flow where it replaced the plan's),
    for the plan as asked (:attr:`PlanRun.asked`: the search held its bound, :attr:`PlanRun.request`)."""
    request, held, rows = run.asked, run.request.goal, len(run.scorer.rows)
    flow = base.flow if real.default else chosen.flow
    sensitivities = measured.sites
    missed: tuple[Note, ...]
    reached, missed = True, ()  # a budget is spent, not reached: the best score within it is the plan
    if isinstance(request.goal, Target) and isinstance(held, Target):
        goal = request.goal
        reached = held.met(real.score) and (not request.held_out or goal.met(applied.held_out))
        missed = held_out_miss(goal, "evaluation", goal.met(real.score), real.score, applied.held_out)
    programs = run.programs(flow, real.suggestions, base.flow)
    candidates, floats = set(run.search.candidates), {s.fqn for s in real.suggestions if s.keep_float}
    reached = reached and (request.speed is None or programs is None or request.speed.met(programs))
    return QuantPlan(
        flow=flow.name,
        backend=request.backend,
        metric=request.metric_name,
        target=request.goal,
        reached=reached,
        default_score=base.score,
        verified_score=real.score,
        held_out_score=applied.held_out,
        steps=search.steps,
        orders=search.orders,
        quantized_fraction=applied.fraction,  # read from the converted model, not from the modes planned
        checks=real.checks,
        sensitivities=sensitivities,
        agreement=spearman([-s.quantized_only for s in sensitivities], [s.gain for s in sensitivities]),
        suggestions=real.suggestions,
        sites=_named_sites(chosen.report.sites, real.suggestions, flow.activations),
        evaluations=math.ceil(run.search.sim.evaluations),
        notes=_speed_notes(request, programs)
        + order_notes(search.orders)
        + real.notes
        + run.failure_notes(flow.name)
        + applied.notes(flow.name)
        + (missed if request.held_out else ())
        + _bound_note(request, held, rows),
        smoothing=SmoothingMapping() if real.default else chosen.smoothing,
        bias_correction=BiasCorrection() if real.default else chosen.bias_correction,
        fx_activations=flow.activations,
        lowered=request.lowering.runtime() if request.lowering is not None else "",
        starts_from=type(request.quantizer).__name__ if request.quantizer is not None else "",
        confidence=request.confidence,
        higher_is_better=run.spec.higher_is_better,
        programs=programs,
        speed=request.speed,
        float_islands=float_islands([s.fqn for s in chosen.report.sites if s.fqn in candidates], floats),
    )


def _speed_notes(request: PlanRequest, programs: PlanPrograms | None) -> tuple[Note, ...]:
    """What the plan's program costs, said first where it disappoints: slower than the float program,
    or short of the speed bound asked (and how far, against the default int8 program's)."""
    if programs is None:
        return ()
    default = f"the default int8 program runs at {programs.default_speedup:.2f}x"
    notes = []
    if programs.slower_than_float:
        said = (
            f"the plan's program is slower than the float program: {programs.planned.latency_ms:.3g} against "
            f"{programs.float_model.latency_ms:.3g} ms a batch ({programs.speedup:.2f}x); {default}: each site "
            "kept in float splits the program with a dequantize and a quantize"
        )
        notes.append(Note(NoteKind.SLOWER_THAN_FLOAT, said))
    if request.speed is not None and not request.speed.met(programs):
        said = f"{request.speed} not reached: {request.speed.shortfall(programs)}; {default}"
        notes.append(Note(NoteKind.SPEED_MISSED, said))
    return tuple(notes)


def _bound_note(request: PlanRequest, held: Target | Budget, rows: int) -> tuple[Note, ...]:
    if request.confidence is None or not isinstance(held, Target):
        return ()
    needed = round(held.threshold * rows + 0.5)
    said = (
        f"{request.goal} held at its {request.confidence:.0%} lower bound over the {rows} evaluation rows (Wilson's): "
        f"the config had to agree on {needed} of them"
    )
    return (Note(NoteKind.AT_BOUND, said),)


def _named_sites(
    sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...], activations: FxActivations | None
) -> tuple[OpSite, ...]:
    """The sites the plan's config is rebuilt from: those its suggestions name and the embeddings;
    every site where FX observes activations its way (whose observers follow the graph's edges)."""
    if activations is not None:
        return sites
    named = {s.fqn for s in suggestions}
    return tuple(site for site in sites if site.fqn in named or site.kind.value == "embedding")


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN with fewer than three finite pairs."""
    pairs = [(a, b) for a, b in zip(x, y) if math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 3:
        return math.nan

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                result[order[k]] = (i + j) / 2.0
            i = j + 1
        return result

    rx, ry = ranks([a for a, _ in pairs]), ranks([b for _, b in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx > 0 and sy > 0 else math.nan


__all__ = ["Progress", "plan", "spearman"]
