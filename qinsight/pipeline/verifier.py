"""The report's config verified before the report offers it (:mod:`qinsight.core.verification`).

Per flow, on the calibration batches split in two (the last quarter, at least one batch, held out
from calibrating; a single batch calibrates and is scored on), each through ``qinsight.quantize``'s
own recipe (prepare, calibrate, convert) and scored by the SQNR of the model's outputs:

1. the flow's default config, and the report's config as the detectors said it;
2. the report's config without each kind of suggestion it holds, once each (where it holds two or
   more: with one, "without" is the default);
3. where two or more kinds' absence scores better, the config without all of them too;
4. the best of these configs is offered (of equals, the one keeping most): a kind that lowers the
   score among the others may still help once another is gone, and a config below the flow's
   default gives way to it, every kind dropped;
5. the offered config's bias correction (:mod:`qinsight.apply.bias_correction`) measured on the
   calibrating batches and the corrected config scored, applied where it scores above the config
   without (a ``bias correction`` check).

So at most ``2 + kinds + 1`` real quantizations per flow (a report holds at most five kinds), and
two for the bias correction (one to measure it, one to score it). A
config the flow cannot build or run scores ``-inf``: the kind that breaks it is dropped with the
flow's error as its reason; only the default config failing leaves the flow unverified.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import attrs
import torch
from torch import nn

from qinsight.apply.bias_correction import measure_bias_correction
from qinsight.apply.torch_flows import TORCH_FLOWS, flow_of
from qinsight.apply.trial import Trial, measuring, model_outputs, run_trial, weighted_layers
from qinsight.compare.metric_functions import sqnr
from qinsight.compare.outputs import output_rows
from qinsight.core.advice import Advice, advice_of
from qinsight.core.backend import Lowering, backend_lowering, planned_backend
from qinsight.core.errors import InvalidParameterError
from qinsight.core.flows import flow_spec, verifying_flows
from qinsight.core.notes import Note, NoteKind
from qinsight.core.outcomes import FailedConfig, Outcome
from qinsight.core.progress import Progress
from qinsight.core.report import Report
from qinsight.core.sites import FLOWS, FlowName, OpKind
from qinsight.core.verification import (
    ConfigParts,
    ConfigVerification,
    KindCheck,
    SuggestionKind,
    kinds_of,
    suggestion_kinds,
    without_kinds,
)
from qinsight.pipeline.saturation import kernels_checked

ENV_VERIFY: Final = "QINSIGHT_VERIFY"
VERIFY_BATCHES = 8  # the most calibration batches a verification keeps: its cost grows with them


def chosen_flows(
    owner: str,
    verify: bool | str | Sequence[str] | None,
    frontend: str,
    backend: str,
    quantizer: object | None = None,
) -> tuple[FlowName, ...]:
    """``verify`` as flows: ``True`` the user's ``quantizer``'s flow where given, else the report's own
    (:func:`~qinsight.core.flows.verifying_flows`), ``False`` none, a
    flow's name or several, ``None`` what ``QINSIGHT_VERIFY`` says (:func:`verify_setting`), else
    ``True``; anything else, a flow that cannot quantize for ``backend`` or cannot take the user's
    ``quantizer``, one :class:`InvalidParameterError`."""
    if verify is None:
        verify = verify_setting()
    if verify is True:
        if quantizer is not None:
            return (flow_of(quantizer, owner, "quantizer").name,)
        return verifying_flows(frontend, backend)
    if verify is False:
        return ()
    names = [verify] if isinstance(verify, str) else list(verify)
    flows = [name for name in names if name in FLOWS]
    if len(flows) < len(names):
        expected = f"True, False, or flows among {', '.join(map(repr, FLOWS))}"
        raise InvalidParameterError(owner, "verify", verify, expected)
    for flow in flows:
        flow_spec(flow).backend_for(owner, backend)
        if quantizer is not None and not TORCH_FLOWS[flow].takes(quantizer):
            raise InvalidParameterError(owner, "verify", flow, f"a flow your {type(quantizer).__name__} quantizes in")
    return tuple(dict.fromkeys(flows))


def verify_setting() -> bool | tuple[str, ...]:
    """``QINSIGHT_VERIFY``: ``0``/``off``/``false`` turns verification off where a call does not ask for
    it (a test suite diagnosing hundreds of small models), ``fx``/``pt2e``/``fx,pt2e`` chooses the
    flows; unset or ``1``/``on``/``true``: the report's own flow."""
    value = os.environ.get(ENV_VERIFY, "").strip().lower()
    if value in ("", "1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    for name in names:
        if name not in FLOWS:
            raise InvalidParameterError(ENV_VERIFY, "value", value, "0, 1, or flows among fx, pt2e (comma-separated)")
    return names


def split(batches: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The batches to calibrate on and to score on: the last quarter (at least one) held out; one
    batch does both."""
    if len(batches) < 2:
        return list(batches), list(batches)
    held = max(1, len(batches) // 4)
    return list(batches[:-held]), list(batches[-held:])


def verify_report(
    model: nn.Module,
    report: Report,
    data: Iterable[Any],
    *,
    flows: bool | str | Sequence[str] | None = True,
    progress: Progress | None = None,
    lowered: bool = False,
    quantizer: object | None = None,
) -> Report:
    """``report`` carrying each flow's verdict on its config, quantized for real.

    Each flow quantizes ``model`` with the report's config on ``data`` (its first :data:`VERIFY_BATCHES`
    batches, calibrated on some and scored on the others), and the kinds of suggestion that lower the
    score are dropped.

    Args:
        model: the float model the report was made of; it is not changed.
        report: the report to verify.
        data: the batches to quantize and score on.
        flows: ``True``: the report's own (:func:`~qinsight.core.flows.verifying_flows`); or flows among
            ``"fx"``, ``"pt2e"``, ``"torchao"``.
        progress: called at each stage (the command line's progress line).
        lowered: (PT2E) each config scored as the program lowered from it for the report's backend, as it
            ships (XNNPACK run by the ExecuTorch runtime, x86 compiled by inductor).
        quantizer: yours (PT2E, what the report was diagnosed against): verification starts from it; it
            is scored beside the flow's default, and where it beats the report's config the verdict says
            to keep it.

    Returns:
        The report with a :class:`ConfigVerification` per flow.

    Raises:
        InvalidParameterError: a flow qinsight does not know, or one that cannot serve the backend.
    """
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()
    planned_backend("verify_report", report.metadata.backend, quantizer)  # one error if q is another backend's
    chosen = chosen_flows("verify_report", flows, report.metadata.frontend, report.metadata.backend, quantizer)
    lowering = lowering_of("verify_report", chosen, report.metadata.backend) if lowered else None
    batches = [batch for _, batch in zip(range(VERIFY_BATCHES), data)]
    if chosen and not batches:
        raise InvalidParameterError("verify_report", "data", "no batches", "at least one batch")
    if _prepared(model):  # its observers are the user's own config: the report's has no model to go on
        said = (
            "the model is prepared already (prepare_fx / prepare_pt2e): "
            "diagnose the float model to verify the report's config"
        )
        return report.with_verification(tuple(ConfigVerification(flow=flow, error=said) for flow in chosen))
    if any(flow_spec(flow).observes_activations for flow in chosen):  # FX's kernels, checked before it is scored
        checking = "checking the FX kernels for saturation"
        if progress is not None:
            progress(checking, 0, 1)
        report = kernels_checked(model, report, batches[0])
        if progress is not None:
            progress(checking, 1, 1)
    stage = f"verifying the report's config in {', '.join(chosen)}"
    verdicts = []
    for done, flow in enumerate(chosen):
        if progress is not None:
            progress(stage, done, len(chosen))
        verdicts.append(verify_flow(model, report, flow, batches, lowering, quantizer))
    if progress is not None:
        progress(stage, len(chosen), len(chosen))
    return report.with_verification(tuple(verdicts))


def _prepared(model: nn.Module) -> bool:
    """Whether ``model`` holds quantization observers (a ``prepare_fx`` or ``prepare_pt2e`` graph)."""
    return any(type(module).__name__.endswith(("Observer", "FakeQuantize")) for module in model.modules())


class _Scorer:
    """A config's SQNR for real (:func:`~qinsight.apply.trial.run_trial`): quantized on the calibrating
    batches, run on the scored ones: a score, or where the flow cannot build or run the config, a
    :class:`FailedConfig` carrying its error. Per config of the report's, its
    :class:`~qinsight.apply.trial.Trial` (:attr:`trials`: the layers the converted model quantizes)."""

    def __init__(self, model: nn.Module, batches: Sequence[Any], lowering: Lowering | None = None) -> None:
        self.model, self.lowering = model, lowering
        self.calibrating, self.scored = split(batches)
        self.reference = _rows(model_outputs(model, self.scored))
        self.trials: dict[Advice, Trial] = {}

    def __call__(self, advice: Advice, quantizer: object | None = None) -> Outcome:
        found = run_trial(
            self.model, advice, self.calibrating, self.scored, quantizer=quantizer, lowering=self.lowering
        )
        if found.failed:
            return FailedConfig(found.error)
        if quantizer is None:  # the user's config: what it quantizes is not the report's to name
            self.trials[advice] = attrs.evolve(found, outputs=())  # kept for its layers: not a model's outputs each
        return sqnr(self.reference, _rows(found.outputs))


def _rows(outputs: Iterable[Any]) -> torch.Tensor:
    return torch.cat([output_rows(output, owner="verify_report") for output in outputs])


def lowering_of(owner: str, flows: Sequence[FlowName], backend: str) -> Lowering | None:
    """The lowering that scores ``flows``' configs as programs (none: no flow to verify in); one error
    where a flow's model is not lowered."""
    for flow in flows:
        if not flow_spec(flow).lowers:
            raise InvalidParameterError(owner, "lowered", True, f"flows whose model is lowered (pt2e), not {flow}")
    return backend_lowering(owner, flow_spec(flows[0]).backend_for(owner, backend)) if flows else None


def verify_flow(
    model: nn.Module,
    report: Report,
    flow: FlowName,
    batches: Sequence[Any],
    lowering: Lowering | None = None,
    quantizer: object | None = None,
) -> ConfigVerification:
    """``report``'s config in ``flow`` verified on ``batches`` (the module docstring's steps); each
    config scored as its program for ``lowering``'s backend where one is given, the user's
    ``quantizer`` too where one is given (:func:`_beside_yours`)."""
    score = _Scorer(model, batches, lowering)
    suggested_advice = advice_of(attrs.evolve(report, verification=(), plan=None), flow)
    base = attrs.evolve(
        suggested_advice,
        suggestions=(),
        fx_activations=None,
        equalization=attrs.evolve(suggested_advice.equalization, entries=()),
    )
    blank = ConfigVerification(
        flow=flow, calibrated=len(score.calibrating), scored=len(score.scored), held_out=len(batches) > 1
    )
    blank = attrs.evolve(blank, lowered=lowering.runtime() if lowering is not None else "")
    default = score(base)
    if isinstance(default, FailedConfig):
        return attrs.evolve(blank, error=f"the {flow} flow cannot quantize this model: {default.error}")
    blank = attrs.evolve(blank, notes=blank.notes + _unfolded_norms(report, flow))
    if quantizer is not None:
        blank = _beside_yours(blank, score(base, quantizer), type(quantizer).__name__)
    parts = ConfigParts(suggested_advice.suggestions, suggested_advice.fx_activations, suggested_advice.equalization)
    # a flow without equalization (PT2E): suggested ones change nothing there (advice_of notes so)
    kinds = tuple(kind for kind in kinds_of(parts) if flow_spec(flow).equalizes or kind is not SuggestionKind.EQUALIZE)

    def config(without: Iterable[SuggestionKind]) -> Advice:
        stripped = without_kinds(parts, tuple(without))
        return attrs.evolve(
            suggested_advice,
            suggestions=stripped.suggestions,
            fx_activations=stripped.fx_activations,
            equalization=stripped.equalization,
        )

    if not kinds:
        nothing = Note(NoteKind.NOTHING_SUGGESTED, "the report suggests nothing the flow's default does not do")
        verdict = attrs.evolve(blank, default=default, suggested=default, score=default, notes=(*blank.notes, nothing))
        verdict, offered = _bias_corrected(verdict, base, score)
        return _left_float(noting_yours(verdict), model, report, offered, score.trials[offered])
    outcome = score(config(()))
    suggested = recorded(outcome)
    without, measured = _left_out_each(kinds, lambda left_out: recorded(score(config(left_out))), suggested, default)
    # the best config measured (of equals, the one keeping most): kinds that hurt among the others may help alone
    dropped = max(measured, key=lambda kinds_left_out: (measured[kinds_left_out], -len(kinds_left_out)))
    reason = _reason(outcome, measured[dropped], dropped)
    checks = tuple(
        KindCheck(
            kind=kind,
            modules=_modules(parts, kind),
            without=without[kind],
            kept=kind not in dropped,
            reason=reason.text if kind in dropped else "",
            why=reason.kind if kind in dropped else None,
        )
        for kind in kinds
    )
    notes = _default_offered(suggested, default) if dropped == frozenset(kinds) else ()
    verdict = attrs.evolve(
        blank, default=default, suggested=suggested, score=measured[dropped], checks=checks, notes=blank.notes + notes
    )
    offered = base if dropped == frozenset(kinds) else config(dropped)
    verdict, offered = _bias_corrected(verdict, offered, score)
    return _left_float(noting_yours(verdict), model, report, offered, score.trials[offered])


def _bias_corrected(verdict: ConfigVerification, offered: Advice, score: _Scorer) -> tuple[ConfigVerification, Advice]:
    """``verdict`` and the ``offered`` config with its bias correction (:mod:`qinsight.apply.bias_correction`)
    measured on the calibrating batches and the corrected config quantized for real and scored: applied
    where it scores above the config without, a :attr:`SuggestionKind.BIAS_CORRECTION` check either way."""
    with measuring():
        try:
            correction = measure_bias_correction(score.model, offered, score.calibrating)
        except Exception:  # the config quantized a moment ago: a flow failing now has nothing to correct
            return verdict, offered
    if not correction.entries:
        return verdict, offered
    corrected = attrs.evolve(offered, bias_correction=correction)
    with_it = recorded(score(corrected))
    kept = with_it > verdict.score
    said = (
        f"not applied: the offered config scored {_said(with_it)} with its biases corrected, "
        f"{_said(verdict.score)} without"
    )
    check = KindCheck(
        kind=SuggestionKind.BIAS_CORRECTION,
        modules=len(correction),
        without=verdict.score,
        kept=kept,
        reason="" if kept else said,
        why=None if kept else NoteKind.HURTS,
    )
    verdict = attrs.evolve(
        verdict, checks=(*verdict.checks, check), bias_correction=correction, score=max(with_it, verdict.score)
    )
    return verdict, corrected if kept else offered


def _left_out_each(
    kinds: tuple[SuggestionKind, ...],
    scored: Callable[[Iterable[SuggestionKind]], float],
    suggested: float,
    default: float,
) -> tuple[dict[SuggestionKind, float], dict[frozenset[SuggestionKind], float]]:
    """Each kind left out once (``scored``: the config without the kinds given), and every config
    measured by the kinds it leaves out: none (``suggested``), all (``default``), each, and those that
    each hurt left out together."""
    without = {kind: scored([kind]) if len(kinds) > 1 else default for kind in kinds}
    measured = {
        frozenset(): suggested,
        frozenset(kinds): default,
        **{frozenset([kind]): without[kind] for kind in kinds},
    }
    hurting = frozenset(kind for kind in kinds if without[kind] > suggested)
    if len(hurting) > 1 and hurting not in measured:
        measured[hurting] = scored(hurting)
    return without, measured


def _default_offered(suggested: float, default: float) -> tuple[Note, ...]:
    """The note where the flow's default scored better than the report's config, and is offered."""
    if not default > suggested:
        return ()
    said = f"the report's config scored {_said(suggested)}, the flow's default {_said(default)} better: the default"
    return (Note(NoteKind.DEFAULT_OFFERED, f"{said} is offered"),)


def _unfolded_norms(report: Report, flow: FlowName) -> tuple[Note, ...]:
    """Why the flow may lose far more than its layers' own errors say: the batch norms it quantizes apart
    from the conv before them (the FX frontend finds them: FX folds a BatchNorm only into a Conv
    module's call, not into a functional conv such as a padding Conv2d subclass's)."""
    norms = [s for s in report.sites if s.kind is OpKind.BATCH_NORM and s.quantized]
    if not norms or report.metadata.frontend != flow_spec(flow).frontend:
        return ()
    named = ", ".join(f"{s.fqn} after {s.source}" if s.source else s.fqn for s in norms[:3])
    more = f" and {len(norms) - 3} more" if len(norms) > 3 else ""
    said = (
        f"{flow_spec(flow).title} cannot fold {len(norms)} batch norms into the convs before them ({named}{more}: "
        "functional convs, not Conv modules): each conv's raw output is rounded per tensor, then its batch norm's, "
        "two roundings where a folded conv makes one, and the batch norm scales the first one's error up channel by "
        "channel; fold them into the convs before quantizing, or quantize through PT2E, whose prepare folds them"
    )
    return (Note(NoteKind.UNFOLDED_NORMS, said),)


def _beside_yours(blank: ConfigVerification, yours: Outcome, name: str) -> ConfigVerification:
    """``blank`` with the user's quantizer's score; a note where the flow cannot run it."""
    notes = blank.notes
    if isinstance(yours, FailedConfig):
        said = f"your {name} cannot quantize this model in the {blank.flow} flow: {yours.error}"
        notes += (Note(NoteKind.YOURS_FAILED, said),)
    return attrs.evolve(blank, yours=recorded(yours), yours_from=name, notes=notes)


def noting_yours(verdict: ConfigVerification) -> ConfigVerification:
    """``verdict`` saying so where the user's quantizer scored above the config the report offers: the
    report's findings stand, its config does not beat what the user already had."""
    if verdict.yours is None or not verdict.yours > verdict.score:
        return verdict
    said = (
        f"your {verdict.yours_from} scored {_said(verdict.yours)}, above the report's config "
        f"({_said(verdict.score)}): keep yours"
    )
    return attrs.evolve(verdict, notes=verdict.notes + (Note(NoteKind.KEEP_YOURS, said),))


def _left_float(
    verdict: ConfigVerification, model: nn.Module, report: Report, offered: Advice, trial: Trial
) -> ConfigVerification:
    """``verdict`` naming the layers with weights that the offered config quantizes and the flow, as
    converted, left in float (read from the converted model); a note where it left every one."""
    kept = {s.fqn for s in offered.suggestions if s.keep_float}
    weighted = weighted_layers(model, report.sites)
    meant = [fqn for fqn in weighted if fqn not in kept]
    left = trial.left_float(meant)
    if not left:
        return verdict
    modules = dict(model.named_modules())
    kinds = sorted({type(modules[fqn]).__name__ for fqn in left})
    said = (
        f"the {verdict.flow} flow quantizes none of this model's {' / '.join(kinds)} layers: the config changes nothing"
        if len(left) == len(meant)
        else f"the {verdict.flow} flow leaves in float {len(left)} of the {len(meant)} layers the config quantizes: "
        + ", ".join(left[:5])
        + (", ..." if len(left) > 5 else "")
    )
    return attrs.evolve(verdict, left_float=left, notes=verdict.notes + (Note(NoteKind.LEFT_FLOAT, said),))


def recorded(outcome: Outcome) -> float:
    """``outcome`` as a :class:`ConfigVerification` records it: its score, ``-inf`` where the flow could not
    build or run the config (what a report file says for "cannot run", its reason naming the error)."""
    return -math.inf if isinstance(outcome, FailedConfig) else outcome


def _reason(suggested: Outcome, final: float, dropped: frozenset[SuggestionKind]) -> Note:
    names = " and ".join(kind.value for kind in SuggestionKind if kind in dropped)
    if isinstance(suggested, FailedConfig):
        return Note(
            NoteKind.FLOW_CANNOT_RUN,
            f"not applied: with it the flow cannot build or run the config ({suggested.error}); "
            f"without {names} {_said(final)}",
        )
    return Note(
        NoteKind.HURTS,
        f"not applied: the report's config scored {_said(suggested)} as suggested, {_said(final)} without {names}, "
        "the best of the configs measured for real",
    )


def _said(value: float) -> str:
    return f"{value:.2f} dB" if math.isfinite(value) else str(value)


def _modules(parts: ConfigParts, kind: SuggestionKind) -> int:
    """How many modules ``kind`` changes (the activation observing: the one config-wide setting)."""
    if kind is SuggestionKind.ACTIVATIONS:
        return 1
    return sum(kind in suggestion_kinds(s) for s in parts.suggestions)


__all__ = [
    "ENV_VERIFY",
    "VERIFY_BATCHES",
    "chosen_flows",
    "lowering_of",
    "noting_yours",
    "split",
    "verify_flow",
    "verify_report",
    "verify_setting",
]
