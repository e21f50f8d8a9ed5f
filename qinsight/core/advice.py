"""Advice: what to quantize how, for one flow, as one torch-free value.

A report's suggestions, a plan's verified config and a report carrying a plan
all come down to the same inputs of a torch config: the flow, the backend, the
sites and the suggestions about them, how FX observes activations, the
equalizations and the smoothing the config is for. :func:`advice_of` picks
them; :mod:`qinsight.apply` is the one place that turns them into torch
objects (a ``QConfigMapping``, a PT2E quantizer, prepare_fx's equalization
config, the smoothed model, the pasteable code) and quantizes a model with
them (:func:`qinsight.quantize`).

What a builder of the config must know besides (the attached plan is for the other flow, the config
is for the smoothed model, PT2E cannot equalize) are ``notes``: each an :class:`~qinsight.core.notes.Note` with a
:class:`~qinsight.core.notes.NoteKind` that code acts on and a text the builders warn with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs

from qinsight.core.bias import BiasCorrection
from qinsight.core.equalization import EqualizationMapping
from qinsight.core.flows import flow_spec, report_flow
from qinsight.core.fx_activations import FxActivations
from qinsight.core.notes import Note, NoteKind
from qinsight.core.plan import QuantPlan
from qinsight.core.sites import FlowName, OpSite, checked_flow
from qinsight.core.smoothing import SmoothingMapping
from qinsight.core.suggestions import QuantSuggestion, merge_suggestions
from qinsight.core.verification import ConfigParts, ConfigVerification, without_kinds

if TYPE_CHECKING:
    from qinsight.core.report import Report


@attrs.frozen(kw_only=True)
class Advice:
    """Everything a torch config for ``flow`` is built from.

    ``source`` says where it comes from (``"report"`` or ``"plan"``);
    ``verified`` whether it was quantized for real and scored (a plan's
    config, or a report's verified in this flow). ``fx_activations`` applies to FX only; ``equalization`` is what
    ``prepare_fx`` equalizes (PT2E has none: a note says so); ``smoothing``
    is what the model must go through first (:func:`qinsight.apply.smoothed`), ``bias_correction`` the
    biases to shift before (:func:`qinsight.apply.bias_corrected`), a verified config's.
    """

    flow: FlowName
    backend: str
    sites: tuple[OpSite, ...] = ()
    suggestions: tuple[QuantSuggestion, ...] = ()
    fx_activations: FxActivations | None = None
    equalization: EqualizationMapping = EqualizationMapping()
    smoothing: SmoothingMapping = SmoothingMapping()
    bias_correction: BiasCorrection = BiasCorrection()
    source: Literal["report", "plan"] = "report"
    verified: bool = False
    notes: tuple[Note, ...] = ()
    starts_from: str = ""  # the user's quantizer a plan's float sites go on top of (its class name)


def _report_default(report: Report) -> str:
    """The flow a report's advice is for unless one is named: the report's own
    (:func:`~qinsight.core.flows.report_flow`), unless its verification found that flow cannot quantize
    the model and another could (a model ``torch.export`` cannot take, which ``quantize_`` can)."""
    own = report_flow(report.metadata.frontend, report.metadata.backend)
    verdict = report.verification_for(own)
    if verdict is not None and not verdict.verified:
        return next((other.flow for other in report.verification if other.verified), own)
    return own


def advice_of(source: Report | QuantPlan | Advice, flow: FlowName | None = None, *, owner: str = "advice_of") -> Advice:
    """The advice ``source`` gives for ``flow``: what a torch config for that flow is built from.

    A report carrying a plan made for ``flow`` gives the plan's verified config; a plan made for another
    flow is not applied (its measurements say nothing about this one), and a note says so. A report
    verified in ``flow`` (:mod:`qinsight.core.verification`) leaves out the kinds of suggestion its
    verification dropped.

    Args:
        source: a report, a plan, or an advice already (returned as it is for its own flow).
        flow: default: a plan's own flow; for a report, the flow its user quantizes with
            (:func:`~qinsight.core.flows.report_flow`: FX for a traced model, PT2E for an exported one, for
            XNNPACK and for a model FX cannot trace), or the flow its verification found could quantize the
            model where that one could not.
        owner: the function named in its errors.

    Returns:
        The :class:`Advice`, for the backend the flow serves (:meth:`~qinsight.core.flows.FlowSpec.backend_for`),
        its notes saying what a builder must know besides.

    Raises:
        InvalidParameterError: a flow qinsight does not know, or one that cannot serve the backend.
    """
    if isinstance(source, Advice):
        if flow is not None and checked_flow(flow, owner) != source.flow:
            note = Note(NoteKind.OTHER_FLOW, f"this advice was made for {source.flow}, not {flow}")
            return _for_flow(source, checked_flow(flow, owner), note, owner)
        return source
    if isinstance(source, QuantPlan):
        wanted = checked_flow(flow if flow is not None else source.flow, owner)
        return _of_plan(source, wanted, owner)
    backend = source.metadata.backend
    wanted = checked_flow(flow if flow is not None else _report_default(source), owner)
    plan = source.plan
    if plan is not None and plan.flow == wanted:
        return _of_plan(plan, wanted, owner)
    spec = flow_spec(wanted)
    advice = Advice(
        flow=wanted,
        backend=spec.backend_for(owner, backend),
        sites=source.sites,
        suggestions=source.suggestions,
        fx_activations=source.fx_activations if spec.observes_activations else None,
        equalization=source.equalization_mapping,
    )
    notes = (
        ()
        if plan is None
        else (
            Note(
                NoteKind.OTHER_FLOW,
                f"the attached plan was made for {plan.flow}, not {wanted}: this config applies the report's "
                f"suggestions, not verified in {wanted}",
            ),
        )
    )
    advice = _per_module(_verified(advice, source.verification_for(wanted)))
    return attrs.evolve(advice, notes=advice.notes + notes + _unequalized(advice))


def _verified(advice: Advice, verdict: ConfigVerification | None) -> Advice:
    """``advice`` as ``verdict`` left it: without the kinds of suggestion it dropped."""
    if verdict is None or not verdict.verified:
        return advice
    parts = without_kinds(ConfigParts(advice.suggestions, advice.fx_activations, advice.equalization), verdict.dropped)
    correction = verdict.applied_bias_correction
    return attrs.evolve(
        advice,
        suggestions=parts.suggestions,
        fx_activations=parts.fx_activations,
        equalization=parts.equalization,
        bias_correction=correction,
        verified=True,
        notes=advice.notes + _corrected(correction, "the verified config", "report"),
    )


def _of_plan(plan: QuantPlan, flow: FlowName, owner: str) -> Advice:
    advice = Advice(
        flow=checked_flow(plan.flow, owner),
        backend=plan.backend,
        sites=plan.sites,
        suggestions=plan.suggestions,
        fx_activations=plan.fx_activations,
        equalization=EqualizationMapping.of(plan.suggestions),
        smoothing=plan.smoothing,
        bias_correction=plan.bias_correction,
        source="plan",
        verified=True,
        starts_from=plan.starts_from,
    )
    if plan.smoothing.entries:
        advice = attrs.evolve(
            advice,
            notes=(
                Note(
                    NoteKind.SMOOTHED_MODEL,
                    f"the plan smooths {len(plan.smoothing)} Linears: its config is for the smoothed model, "
                    "model = qinsight.smoothed(model, plan)",
                ),
            ),
        )
    advice = attrs.evolve(advice, notes=advice.notes + _corrected(plan.bias_correction, "the plan", "plan"))
    if advice.flow != flow:
        said = f"the plan was made for {advice.flow}, not {flow}: its config is not verified in {flow}"
        return _for_flow(advice, flow, Note(NoteKind.OTHER_FLOW, said), owner)
    return _per_module(advice)


def _corrected(correction: BiasCorrection, who: str, source: str) -> tuple[Note, ...]:
    """The note of a config made for the model with its biases corrected; none where it corrects none."""
    if not correction.entries:
        return ()
    said = f"{who} corrects the biases of {len(correction)} layers: its config is for "
    return (Note(NoteKind.BIAS_CORRECTED, said + f"model = qinsight.bias_corrected(model, {source})"),)


def _for_flow(advice: Advice, flow: FlowName, note: Note, owner: str) -> Advice:
    """``advice`` used for the other flow: its suggestions, unverified, with ``note``."""
    spec = flow_spec(flow)
    moved = attrs.evolve(
        advice,
        flow=flow,
        backend=spec.backend_for(owner, advice.backend),
        fx_activations=advice.fx_activations if spec.observes_activations else None,
        verified=False,
        notes=advice.notes + (note,),
        starts_from="",
    )
    moved = _per_module(moved)
    return attrs.evolve(moved, notes=moved.notes + _unequalized(moved))


def _per_module(advice: Advice) -> Advice:
    """``advice`` as its flow can apply it where a module is called at several places: the suggestions
    of its calls merged into one for all of them (:func:`_one_for_all`), as the flow configures a module
    once (FX's ``set_module_name``). A note names each module whose calls were advised apart, and what
    its config does instead."""
    calls: dict[str, list[OpSite]] = {}
    for site in advice.sites:
        if site.call is None:
            calls.setdefault(site.module, []).append(site)
    by_site = {s.fqn: s for s in advice.suggestions}
    merged: dict[str, QuantSuggestion] = {}
    said = []
    for module, sites in calls.items():
        if len(sites) > 1:
            own = [by_site.get(site.fqn, QuantSuggestion(fqn=site.fqn)) for site in sites]
            applied = _one_for_all(module, own, flow_spec(advice.flow).floats_calls)
            merged.update({s.fqn: s for s in applied})
            if any(_opinions(a) != _opinions(s) for a, s in zip(applied, own)):
                advised = "; ".join(f"{s.fqn}: {s.describe()}" for s in own)
                said.append(f"{module} ({advised}) gets {applied[0].describe()} for every call")
    if not said:
        return advice
    suggestions = [merged.get(s.fqn, s) for s in advice.suggestions]
    suggestions += [s for fqn, s in merged.items() if fqn not in by_site and not s.changes_nothing]
    title = flow_spec(advice.flow).title
    note = Note(NoteKind.CALLS_MERGED, f"{title} configures a module once for all its calls: " + "; ".join(said))
    return attrs.evolve(advice, suggestions=tuple(suggestions), notes=advice.notes + (note,))


def _one_for_all(module: str, own: list[QuantSuggestion], floats_calls: bool) -> list[QuantSuggestion]:
    """One suggestion for every call of ``module`` (``own``: each call's), accuracy first
    (:func:`merge_suggestions`); a flow that ``floats_calls`` keeps each call's own ``keep_float``."""
    merged, _conflicts = merge_suggestions(
        attrs.evolve(s, fqn=module, keep_float=None if floats_calls else s.keep_float) for s in own
    )
    chosen = merged[0]
    return [
        attrs.evolve(chosen, fqn=s.fqn, keep_float=s.keep_float if floats_calls else chosen.keep_float) for s in own
    ]


def _opinions(suggestion: QuantSuggestion) -> tuple[object, ...]:
    return (suggestion.activation, suggestion.weight, suggestion.equalize, bool(suggestion.keep_float))


def _unequalized(advice: Advice) -> tuple[Note, ...]:
    spec = flow_spec(advice.flow)
    if spec.equalizes or not advice.equalization.entries:
        return ()
    said = f"{spec.title} has no input-weight equalization; these modules stay unequalized: "
    return (Note(NoteKind.UNEQUALIZED, said + ", ".join(advice.equalization.fqns)),)


__all__ = ["Advice", "advice_of"]
