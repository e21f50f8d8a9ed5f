"""Where advice becomes torch objects: the one layer that builds them.

Every function takes what holds advice, a :class:`~qinsight.core.report.Report`,
a :class:`~qinsight.core.plan.QuantPlan` or an :class:`~qinsight.core.advice.Advice`,
and picks the advice for its flow with :func:`~qinsight.core.advice.advice_of`
(a report carrying a plan for that flow gives the plan's verified config):

- :func:`qconfig_mapping` (FX), :func:`pt2e_quantizer` (PT2E, torchao);
- :func:`equalization_config`: prepare_fx's ``_equalization_config``;
- :func:`smoothed`: the model a smoothed plan's config is for;
- :func:`bias_corrected`: the model a bias-corrected config is for (:mod:`.bias_correction` measures it);
- :func:`config_code`: the Python that builds the FX config, as the page shows it;
- :func:`quantize`: all of it applied, the model prepared, calibrated and converted;
- :func:`fqn_to_config`: torchao's ``FqnToConfig`` of a mixed-format plan (:mod:`.torchao`), or of the
  plan a report carries, which :func:`quantize` applies with ``quantize_`` (``flow="torchao"``; a report
  without one: its int8 advice, calibrated, :func:`~qinsight.apply.torchao.int8_recipe`).

The advice's notes (a plan for the other flow, a config for the smoothed
model, PT2E without equalization) are warned of as the objects are built.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from qinsight.apply import code, corrected_model, equalization_qconfig, pt2e, qconfigs, smoothed_model, torchao
from qinsight.core.advice import Advice, advice_of
from qinsight.core.errors import InvalidParameterError
from qinsight.core.flows import check_flow_backend, flow_spec
from qinsight.core.formats import FormatPlan
from qinsight.core.notes import NoteWarning
from qinsight.core.plan import QuantPlan
from qinsight.core.report import Report
from qinsight.core.sites import FlowName, checked_flow

if TYPE_CHECKING:
    from torch import nn
    from torch.ao.quantization import QConfigMapping


def _advice(source: Report | QuantPlan | Advice, flow: FlowName, owner: str) -> Advice:
    advice = advice_of(source, flow, owner=owner)
    for note in advice.notes:
        warnings.warn(NoteWarning(note), stacklevel=3)
    return advice


def qconfig_mapping(source: Report | QuantPlan | Advice, base: QConfigMapping | None = None) -> QConfigMapping:
    """The FX ``QConfigMapping`` of ``source``'s advice.

    Args:
        source: a report, a plan or an advice (keyed on the float model's module names).
        base: the mapping the advice is added to (default: the backend's default mapping).

    Returns:
        The mapping for ``prepare_fx``.
    """
    return qconfigs.qconfig_mapping(_advice(source, "fx", "qconfig_mapping"), base)


def pt2e_quantizer(source: Report | QuantPlan | Advice, backend: str | None = None, *, quantizer: Any = None) -> Any:
    """A PT2E quantizer applying ``source``'s advice.

    Args:
        source: a report, a plan or an advice.
        backend: ``"x86"`` (torchao's X86InductorQuantizer, ``pip install 'qinsight[pt2e]'``) or
            ``"xnnpack"`` (ExecuTorch's XNNPACKQuantizer, ``pip install 'qinsight[executorch]'``); default:
            the source's own backend where PT2E serves it, else x86.
        quantizer: yours (a plan made with ``quantizer=`` needs it again): that quantizer with the
            advice's float sites stripped after it annotates.

    Returns:
        The quantizer for ``prepare_pt2e``; what it cannot honour of the advice it names in
        ``unhonoured`` and warns about.

    Raises:
        MissingExtraError: the extra the backend's quantizer needs is not installed.
    """
    if backend is not None:
        check_flow_backend("pt2e_quantizer", "pt2e", backend)
    advice = _advice(source, "pt2e", "pt2e_quantizer")
    if quantizer is not None or advice.starts_from:
        from qinsight.apply.recipe import torch_config

        return torch_config(advice, quantizer, "pt2e_quantizer")
    return pt2e.pt2e_quantizer(advice, backend)


def equalization_config(source: Report | QuantPlan | Advice) -> QConfigMapping:
    """``prepare_fx``'s ``_equalization_config`` for the modules ``source``'s FX advice equalizes.

    Args:
        source: a report, a plan or an advice.

    Returns:
        The ``QConfigMapping`` to pass as ``prepare_fx(..., _equalization_config=...)``.
    """
    from torch.ao.quantization import QConfigMapping

    mapping = equalization_qconfig.equalization_qconfig_mapping(
        advice_of(source, "fx", owner="equalization_config").equalization
    )
    return mapping if mapping is not None else QConfigMapping()


def smoothed(model: nn.Module, source: Report | QuantPlan | Advice) -> nn.Module:
    """The model a smoothed plan's config is for.

    Args:
        model: the float model; it is not changed.
        source: a report, a plan or an advice.

    Returns:
        A copy of ``model`` with the Linears ``source`` smooths smoothed (``model`` itself when none).
    """
    return smoothed_model.apply_smoothing(model, advice_of(source).smoothing)


def bias_corrected(model: nn.Module, source: Report | QuantPlan | Advice, flow: FlowName | None = None) -> nn.Module:
    """The model a bias-corrected config is for: the biases its verification found worth shifting, shifted.

    ``qinsight.quantize`` corrects them itself; call this before your own ``prepare_fx`` /
    ``prepare_pt2e`` with the config of :func:`qconfig_mapping` or :func:`pt2e_quantizer`.

    Args:
        model: the float model the report was made of; it is not changed.
        source: a report, a plan or an advice.
        flow: the flow whose verified correction to apply (default: the report's, as :func:`quantize`).

    Returns:
        A copy of ``model`` with each corrected bias shifted (``model`` itself when there is none).
    """
    return corrected_model.apply_bias_correction(model, advice_of(source, flow, owner="bias_corrected").bias_correction)


def config_code(source: Report | QuantPlan | Advice) -> list[str]:
    """Python lines that build the same FX ``QConfigMapping`` (``mapping``) and equalization config
    (``equalization``) as :func:`qconfig_mapping` and :func:`equalization_config`.

    Args:
        source: a report, a plan or an advice (its FX advice).

    Returns:
        The lines of the code, to paste into a program (the HTML page shows them).
    """
    return code.config_code(advice_of(source, "fx", owner="config_code"))


def quantize(
    model: nn.Module,
    source: Report | QuantPlan | Advice | FormatPlan,
    calibration_data: Iterable[Any] | None = None,
    *,
    flow: FlowName | None = None,
    quantizer: Any = None,
) -> nn.Module:
    """``model`` quantized as ``source`` advises, as a user's flow would: smoothed where the advice
    smooths, prepared (with the equalization in FX), calibrated and converted.

    Args:
        model: the float model; it is not changed.
        source: a report, a plan, an :class:`Advice` or a :class:`FormatPlan`. A format plan (or with
            ``flow="torchao"`` the one a report carries) is applied by torchao's ``quantize_`` with
            :func:`fqn_to_config`, no calibration; a report without one, with ``flow="torchao"``, is
            its int8 advice applied by ``quantize_``, each static Linear's scale calibrated.
        calibration_data: the batches every observer is calibrated on (all of them).
        flow: ``"fx"``, ``"pt2e"`` or ``"torchao"``; default: a plan's own flow; for a report, the flow
            its user quantizes with (FX for a traced model, PT2E for an exported one, for XNNPACK and for
            a model FX cannot trace; one its verification found could quantize the model where that one
            could not).
        quantizer: yours, which a plan made with ``quantizer=`` starts from (its float sites are stripped
            from it).

    Returns:
        The converted model (an FX or PT2E ``GraphModule``, or a copy with torchao's quantized weights).

    Raises:
        InvalidParameterError: no calibration data for a flow that calibrates, or a flow it cannot use.
        FrontendError: the flow cannot prepare the model (tracing, export, a quantizer refusing it).
    """
    if isinstance(source, FormatPlan):
        return torchao.quantize_formats(model, source)
    chosen = checked_flow(flow, "quantize") if flow is not None else None
    if isinstance(source, Report) and source.formats is not None and chosen and flow_spec(chosen).plans_formats:
        return torchao.quantize_formats(model, source.formats)  # the flow's measured formats, not its int8 advice
    if calibration_data is None:
        raise InvalidParameterError(
            "quantize", "calibration_data", None, "the batches to calibrate the static flow's observers on"
        )
    from qinsight.apply import recipe  # the flows' prepare and convert: only when a model is quantized

    return recipe.quantize_with(model, advice_of(source, flow, owner="quantize"), list(calibration_data), quantizer)


def fqn_to_config(source: FormatPlan | Report | Mapping[str, str]) -> Any:
    """torchao's ``FqnToConfig`` giving each Linear of ``source`` its format: ``quantize_(model,
    fqn_to_config(plan), filter_fn=None)`` quantizes ``model`` as the plan says (``pip install
    'qinsight[pt2e]'``).

    Args:
        source: a format plan, the plan a report carries, or Linear name → format name such as
            ``{"model.layers.0.mlp.down_proj": "int4_g32"}``.

    Returns:
        The ``FqnToConfig``.

    Raises:
        InvalidParameterError: a report that carries no format plan.
    """
    return torchao.fqn_to_config(source if isinstance(source, Mapping) else _format_plan(source))


def _format_plan(source: Report | QuantPlan | Advice | FormatPlan) -> FormatPlan:
    """The format plan ``source`` is or carries: torchao's advice is measured by a plan, never guessed."""
    if isinstance(source, FormatPlan):
        return source
    if isinstance(source, Report) and source.formats is not None:
        return source.formats
    raise InvalidParameterError(
        "quantize",
        "source",
        type(source).__name__,
        "a FormatPlan, or a report carrying one, for torchao's formats: qinsight.plan_formats(model, data) measures "
        "one "
        "(report.with_formats(plan) attaches it; `qinsight plan --flow torchao` writes it)",
    )


__all__ = [
    "config_code",
    "equalization_config",
    "fqn_to_config",
    "pt2e_quantizer",
    "qconfig_mapping",
    "quantize",
    "smoothed",
    "bias_corrected",
]
