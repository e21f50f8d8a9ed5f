"""``qinsight.plan``: from a diagnosis to a config that reaches a quality target, every step measured.

1. **Checks** (:mod:`.checks`). Each report suggestion is applied alone and
   among the others, in the simulation (keep-float, activation modes) or for
   real (equalization, per-tensor weights); one that lowers the score among
   the others is dropped, with the measured effect as the reason.
2. **Sensitivity.** Per candidate site: the score with only that site in
   float, and with only that site quantized. Both start from cached runs
   (all quantized, all float) and recompute only what the site reaches.
3. **Search** (:mod:`.curve`): the quality-vs-fraction-quantized curve from
   every candidate in float, the longest prefix that meets the target, then
   each later step tried alone on top of it (for top-1, in two orders of the
   sites, the search that quantizes more kept).
4. **Verification.** The plan's config and the flow's default are quantized
   for real (prepare, calibrate, convert) and scored. Where the real score
   misses the target the simulation reached, the longest prefix of the
   sites the search quantized that reaches it for real is found by
   bisection; a plan scoring below the default is replaced by the default
   config, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch import nn

from qinsight.apply.smoothing import apply_smoothing
from qinsight.core.activations import FxActivations
from qinsight.core.errors import InvalidParameterError
from qinsight.core.plan import PlanStep, QuantPlan, SiteSensitivity, SuggestionCheck, Target
from qinsight.core.precision import activation_bits
from qinsight.core.report import Report
from qinsight.core.sites import OpKind, OpSite
from qinsight.core.smoothing import SmoothingMapping
from qinsight.core.suggestions import QuantSuggestion
from qinsight.frontends import classify, eval_mode, run_batch
from qinsight.planning.checks import check_all, mode_of, split_for_real
from qinsight.planning.curve import Noise, Progress, Search, choose_order, final_score, measure_dynamic_noise, taken
from qinsight.planning.flows import Flow, flow_for, mode_suggestions
from qinsight.planning.scores import MetricFunction, Scorer
from qinsight.planning.simulate import Run
from qinsight.planning.smoothing import choose_smoothing
from qinsight.planning.switches import Mode


def _quiet(_stage: str, _done: int, _total: int) -> None:
    return None


def plan(
    model: nn.Module,
    calibration_data: Iterable[Any],
    evaluation_data: Iterable[Any],
    *,
    target: str | Target = "sqnr>=30",
    flow: str = "fx",
    backend: str = "x86",
    metric: str | MetricFunction | None = None,
    report: Report | None = None,
    progress: Progress | None = None,
    smoothing: bool = False,
) -> QuantPlan:
    """The sites to keep in float so that ``model``, quantized with ``flow``, reaches ``target`` on
    ``evaluation_data``, starting from the report's verified suggestions (:class:`QuantPlan`).

    ``target`` is ``"sqnr>=30"``, ``"cosine>=0.995"``, ``"top1>=0.94"``, or
    ``"float<=N"`` (the best score with at most N sites in float, by
    ``metric``, default SQNR); with ``metric`` a function of (float outputs,
    quantized outputs), name it in the target (``"accuracy>=0.98"``).
    ``report`` is the diagnosis to start from (default: :func:`qinsight.diagnose`
    on the calibration data). With ``smoothing``, the inputs of the Linears
    whose measured error it lowers are smoothed first (:mod:`.smoothing`) and
    the plan is made for the smoothed model: ``qinsight.smoothed(model, plan)``
    is what its config quantizes, while its ``default_score`` stays that of
    the model as given.
    """
    goal = Target.parse(target) if isinstance(target, str) else target
    calibration, evaluation = list(calibration_data), list(evaluation_data)
    for name, batches in (("calibration_data", calibration), ("evaluation_data", evaluation)):
        if not batches:
            raise InvalidParameterError("plan", name, "no batches", "at least one batch")
    chosen = metric if metric is not None else ("sqnr" if goal.is_budget else goal.metric)
    metric_name = chosen if isinstance(chosen, str) else (goal.metric if not goal.is_budget else getattr(chosen, "__name__", "metric"))
    if report is None:
        from qinsight.pipeline import diagnose

        report = diagnose(model, calibration, backend=backend)
    steps_of = progress or _quiet
    scorer = Scorer(_float_outputs(model, evaluation), chosen, metric_name)

    def score_of(flow: Flow) -> float:  # the flow's config without suggestions, quantized for real
        return scorer(_outputs(flow.quantize((), calibration), evaluation))

    baseline = _flow(flow, model, report, backend, calibration + evaluation)
    default_score = score_of(baseline)
    observing, observing_checks, base_score = _observing(
        flow, model, report, backend, calibration + evaluation, default_score, goal, score_of
    )
    smoothed = SmoothingMapping()
    if smoothing:
        steps_of("smoothing the Linears' inputs", 0, 1)
        smoothed, model, report = _smoothed(model, calibration, report, flow, backend, observing is not None)
    flow_impl = observing if observing is not None else baseline
    if smoothed.entries:
        activations = report.fx_activations if observing is not None else None  # the smoothed model's own check
        flow_impl = _flow(flow, model, report, backend, calibration + evaluation, activations)
    steps_of("calibrating the simulation", 0, 1)
    sim = flow_impl.simulation(calibration)
    names = {site.fqn for site in report.sites}
    # the smoothing's divisions stay float, unsearched: quantized, they would quantize the factors per tensor
    divisions = {site: Mode.FLOAT for site in smoothed.divisions if site in sim.sites}
    candidates = [site for site in sim.sites if site in names and site not in divisions]
    kinds = {site.fqn: site.kind.value for site in report.sites}
    search = Search(sim, scorer, candidates, _parameters(model, candidates), kinds, steps_of, divisions)
    default = {**{site: Mode.STATIC for site in candidates}, **divisions}
    higher = goal.higher_is_better or goal.is_budget

    def real(advice: tuple[QuantSuggestion, ...]) -> float:
        return scorer(_outputs(flow_impl.quantize(advice, calibration), evaluation))

    checks, start, kept = check_all(
        sim, lambda run: scorer(run.outputs), real, report.suggestions, default, evaluation, higher,
        flow_impl.name, flow_impl.equalizes, base_score if not smoothed.entries else real(()),
    )
    checks = observing_checks + checks
    sensitivities, noise, quantized_run, float_run = _sensitivities(search, start, evaluation)
    dynamic_noise = measure_dynamic_noise(search, start, float_run, noise)
    steps, modes, notes = choose_order(search, goal, start, float_run, quantized_run, noise, dynamic_noise)
    kept, checks, verified, unseen = _unseen_parts_checked(real, goal, kept, checks, steps, modes)
    notes += unseen
    modes, verified, more = _verified(real, goal, kept, start, steps, modes, verified)
    notes += more
    suggestions = _advice(kept, modes)
    if _worse(verified, default_score, goal):
        notes.append(f"the plan ({verified:.4g}) scored below the default config ({default_score:.4g}): the default is returned")
        suggestions, verified, modes = (), default_score, {site: Mode.STATIC for site in candidates}
        smoothed, flow_impl = SmoothingMapping(), baseline
    return QuantPlan(
        flow=flow_impl.name,
        backend=backend,
        metric=metric_name,
        target=goal,
        reached=goal.is_budget or goal.met(verified),
        default_score=default_score,
        verified_score=verified,
        steps=steps,
        quantized_fraction=search.fraction(modes),
        checks=checks,
        sensitivities=sensitivities,
        agreement=_spearman([-s.quantized_only for s in sensitivities], [s.gain for s in sensitivities]),
        suggestions=suggestions,
        sites=_named_sites(report.sites, suggestions, flow_impl.activations),
        evaluations=math.ceil(sim.evaluations),
        notes=tuple(notes),
        smoothing=smoothed,
        fx_activations=flow_impl.activations,
    )


def _flow(
    name: str, model: nn.Module, report: Report, backend: str, batches: list[Any], activations: FxActivations | None = None
) -> Flow:
    flow = flow_for(name, model, report.sites, backend, activations)
    flow.shapes_from(batches)
    return flow


def _observing(
    name: str, model: nn.Module, report: Report, backend: str, batches: list[Any], default_score: float, goal: Target,
    score_of: Callable[[Flow], float],
) -> tuple[Flow | None, tuple[SuggestionCheck, ...], float]:
    """The FX flow observing activations as the report says (:mod:`qinsight.core.activations`) where,
    quantized for real, it scores no worse than torch's default; its check; the score the plan's
    other checks start from."""
    if name != "fx" or report.fx_activations is None:
        return None, (), default_score
    candidate = _flow(name, model, report, backend, batches, report.fx_activations)
    score = score_of(candidate)
    kept = not _worse(score, default_score, goal)
    check = SuggestionCheck(
        fqn="(activations)", change=report.fx_activations.describe(), before=default_score, alone=score, kept=kept,
        reason="measured for real (prepare, calibrate, convert)" if kept
        else f"not applied: {score - default_score:+.3g} on the output against torch's default observing, measured for real",
    )
    return (candidate, (check,), score) if kept else (None, (check,), default_score)


def _smoothed(
    model: nn.Module, calibration: list[Any], report: Report, flow: str, backend: str, eight_bits: bool
) -> tuple[SmoothingMapping, nn.Module, Report]:
    """The Linears' inputs smoothed where that lowers their measured error, the smoothed model and
    its diagnosis (the model and ``report`` as they are when nothing is smoothed)."""
    from qinsight.pipeline import diagnose

    # PT2E's x86 quantizer and qinsight's FX activations keep 8 bits; torch's FX default, 7
    bits = activation_bits(backend, torch_default=flow == "fx" and not eight_bits)
    linears = [site.fqn for site in report.sites if site.kind is OpKind.LINEAR]
    mapping = choose_smoothing(model, calibration, linears, bits)
    if not mapping.entries:
        return mapping, model, report
    smoothed = apply_smoothing(model, mapping)
    return mapping, smoothed, diagnose(smoothed, calibration, backend=backend)


def _float_outputs(model: nn.Module, batches: Sequence[object]) -> list[Any]:
    with eval_mode(model), torch.no_grad():
        return [run_batch(model, batch) for batch in batches]


def _outputs(model: nn.Module, batches: Sequence[object]) -> list[Any]:
    with torch.no_grad():
        return [run_batch(model, batch) for batch in batches]


def _parameters(model: nn.Module, sites: list[str]) -> dict[str, int]:
    counts = {}
    modules = dict(model.named_modules())
    for site in sites:
        module = modules.get(site)
        found = classify(module) if module is not None else None
        weight = getattr(found[1] if found else module, "weight", None)
        counts[site] = int(weight.numel()) if isinstance(weight, torch.Tensor) else 0
    return counts


def _sensitivities(
    search: Search, start: dict[str, Mode], evaluation: Sequence[object]
) -> tuple[tuple[SiteSensitivity, ...], Noise, Run, Run]:
    """Each site alone in float and alone quantized; the noise of each alone quantized, per order the
    search can take (:attr:`Scorer.orders`); the all-quantized and all-float runs later runs start from."""
    sim, scorer = search.sim, search.scorer
    quantized_run = sim.run(start, evaluation)
    everything_float = search.everything_float()
    float_run = sim.run(everything_float, evaluation)
    all_quantized = scorer(quantized_run.outputs)
    found: list[SiteSensitivity] = []
    noise: Noise = {order: {} for order in scorer.orders}
    for done, site in enumerate(search.candidates):
        search.progress("measuring sensitivity", done, len(search.candidates))
        float_only = scorer(sim.run_changed({**start, site: Mode.FLOAT}, quantized_run).outputs)
        quantized_mode = start[site] if start[site] is not Mode.FLOAT else Mode.STATIC
        alone = sim.run_changed({**everything_float, site: quantized_mode}, float_run).outputs
        for order, value in scorer.noise(alone).items():
            noise[order][site] = value
        found.append(
            SiteSensitivity(
                fqn=site,
                kind=search.kinds.get(site, ""),
                parameters=search.parameters[site],
                float_only=float_only,
                quantized_only=scorer(alone),
                gain=float_only - all_quantized,
            )
        )
    return tuple(found), noise, quantized_run, float_run


def _verified(
    real_score: Callable[[tuple[QuantSuggestion, ...]], float],
    goal: Target,
    kept: tuple[QuantSuggestion, ...],
    start: dict[str, Mode],
    steps: tuple[PlanStep, ...],
    modes: dict[str, Mode],
    verified: float,
) -> tuple[dict[str, Mode], float, list[str]]:
    """The plan's config as quantized for real (``verified``). Where it misses a target the
    simulation reached, the longest prefix of the quantized sites (in the order they were taken)
    that reaches it for real is found by bisection: each probe is one real quantization."""

    def real(prefix_modes: Mapping[str, Mode]) -> float:
        return real_score(_advice(kept, prefix_modes))

    if goal.is_budget or goal.met(verified) or not goal.met(final_score(steps)):
        return modes, verified, []
    path = [(step.fqn, Mode(step.mode) if step.mode else start[step.fqn]) for step in steps if step.fqn and step.kept]
    floats = {site: Mode.FLOAT for site, _ in path}

    def prefix(n: int) -> dict[str, Mode]:
        return taken({**modes, **floats}, path[:n])

    low, high, best = 0, len(path), math.nan  # prefix(low) is assumed to reach the target, prefix(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        score = real(prefix(middle))
        if goal.met(score):
            low, best = middle, score
        else:
            high = middle
    if math.isnan(best):
        best = real(prefix(low))
    note = (
        f"the real flow scored {verified:.6g} where the simulation reached the target: "
        f"{len(path) - low} of the {len(path)} steps the search took are undone after bisecting for real"
    )
    return prefix(low), best, [note]


def _unseen_parts_checked(
    real_score: Callable[[tuple[QuantSuggestion, ...]], float],
    goal: Target,
    kept: tuple[QuantSuggestion, ...],
    checks: tuple[SuggestionCheck, ...],
    steps: tuple[PlanStep, ...],
    modes: dict[str, Mode],
) -> tuple[tuple[QuantSuggestion, ...], tuple[SuggestionCheck, ...], float, list[str]]:
    """The plan's config quantized for real, with the kept parts the search cannot see (equalization,
    per-tensor weights: they were measured on the default config, not on this one). Where that
    misses a target the simulation reached, the config as searched is quantized too, and where it
    scores better those parts are dropped, their checks saying why."""
    verified = real_score(_advice(kept, modes))
    as_searched, unseen = split_for_real(kept)
    if not unseen or goal.is_budget or goal.met(verified) or not goal.met(final_score(steps)):
        return kept, checks, verified, []
    searched = tuple(as_searched)  # one part per kept suggestion, as ``kept`` has one per site
    without = real_score(_advice(searched, modes))
    if not _worse(verified, without, goal):
        return kept, checks, verified, []
    said = ", ".join(part.describe() + " at " + part.fqn for part in unseen)
    reason = f"not applied: the planned config scored {verified:.4g} with it, {without:.4g} without, measured for real"
    dropped = {(part.fqn, part.describe()) for part in unseen}
    checks = tuple(
        attrs.evolve(check, kept=False, reason=reason) if check.kept and (check.fqn, check.change) in dropped else check
        for check in checks
    )
    return searched, checks, without, [f"{said}: dropped, the planned config scored {verified:.4g} with them, {without:.4g} without"]


def _advice(kept: tuple[QuantSuggestion, ...], modes: Mapping[str, Mode]) -> tuple[QuantSuggestion, ...]:
    """The kept suggestions, and the plan's own for each site it runs otherwise than they say
    (kept in float, or a Linear made dynamic)."""
    said = {s.fqn: mode_of(s) for s in kept}
    moved = {site: mode for site, mode in modes.items() if mode is not Mode.STATIC and said.get(site, Mode.STATIC) is not mode}
    return tuple(s for s in kept if s.fqn not in moved) + mode_suggestions(moved)


def _worse(score: float, than: float, goal: Target) -> bool:
    if math.isnan(score) or math.isnan(than):
        return False
    return score < than if goal.higher_is_better or goal.is_budget else score > than


def _named_sites(
    sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...], activations: FxActivations | None
) -> tuple[OpSite, ...]:
    """The sites the plan's config is rebuilt from: those its suggestions name and the embeddings;
    every site where FX observes activations its way (whose observers follow the graph's edges)."""
    if activations is not None:
        return sites
    named = {s.fqn for s in suggestions}
    return tuple(site for site in sites if site.fqn in named or site.kind.value == "embedding")


def _spearman(x: Sequence[float], y: Sequence[float]) -> float:
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


__all__ = ["Progress", "plan"]
