"""The recipe behind ``qinsight.quantize``: what a user does with advice: correct the biases and smooth
where it says so, prepare, calibrate, convert.

FX: ``prepare_fx(model, mapping, example_inputs, _equalization_config=...)``;
PT2E: ``torch.export`` (the batch dimension and every input dimension that
differs between the calibration batches dynamic), then ``prepare_pt2e(exported, quantizer)``. Both
calibrate on every batch in eval mode without gradients, then convert. The
user's model is never changed: the flows prepare a copy.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from qinsight.apply.corrected_model import apply_bias_correction
from qinsight.apply.equalization_qconfig import equalization_qconfig_mapping
from qinsight.apply.pt2e import on_top_of
from qinsight.apply.smoothed_model import apply_smoothing
from qinsight.apply.torch_flows import TORCH_FLOWS, TorchFlow, prepare_config
from qinsight.core.advice import Advice
from qinsight.core.errors import FrontendError, InvalidParameterError
from qinsight.core.flows import check_flow_backend, flow_spec
from qinsight.core.notes import NoteKind, NoteWarning
from qinsight.core.sites import FlowName
from qinsight.frontends import eval_mode, example_inputs, run_batch

# what the notes ask of the user's model, which quantize_with does itself
_DONE_HERE = frozenset({NoteKind.SMOOTHED_MODEL, NoteKind.BIAS_CORRECTED})


def default_config(flow: FlowName, backend: str, owner: str = "compare") -> tuple[object, str]:
    """torch's default config of ``flow`` for ``backend`` and its name: FX's default ``QConfigMapping``,
    the backend's PT2E quantizer; one error naming the flow that serves ``backend`` where ``flow`` does not."""
    check_flow_backend(owner, flow, backend)
    return TORCH_FLOWS[flow].default(backend)


def torch_config(advice: Advice, quantizer: object | None = None, owner: str = "quantize") -> object:
    """The flow's config for ``advice``: a ``QConfigMapping`` (FX) or the backend's PT2E quantizer; with
    the user's ``quantizer``, that quantizer with the advice's float sites stripped (a plan made with
    ``quantizer=`` must be given it again: its config is not qinsight's to rebuild)."""
    if quantizer is not None:
        if not TORCH_FLOWS[advice.flow].takes(quantizer):
            expected = f"a config the {advice.flow} flow takes (a torchao Quantizer for PT2E advice)"
            raise InvalidParameterError(owner, "quantizer", type(quantizer).__name__, expected)
        return on_top_of(quantizer, advice.sites, advice.suggestions)
    if advice.starts_from:
        raise InvalidParameterError(owner, "quantizer", None, f"the {advice.starts_from} the plan started from")
    return TORCH_FLOWS[advice.flow].config_of(advice)


def varying_shapes(batches: Sequence[object]) -> tuple[dict[int, Any] | None, ...] | None:
    """``torch.export``'s ``dynamic_shapes``: every input dimension that differs between ``batches``
    (token counts) dynamic, and every batch dimension (the first, of a size above 1), where the model
    allows it (``Dim.AUTO``: a model whose code fixes it gets it fixed), so that the quantized model
    runs batches of another size than its calibration's; ``None`` where nothing is dynamic. A batch of
    1 cannot say it is a batch dimension: torch fixes a size-1 dimension."""
    examples = [example_inputs(batch) for batch in batches]
    first = examples[0]

    def varying(position: int) -> dict[int, Any] | None:
        value = first[position]
        if not isinstance(value, torch.Tensor):
            return None
        dims = {
            dim: torch.export.Dim.AUTO
            for dim in range(value.dim())
            if (dim == 0 and value.shape[0] > 1)
            or any(
                isinstance(e[position], torch.Tensor) and e[position].shape[dim] != value.shape[dim] for e in examples
            )
        }
        return dims or None

    shapes = tuple(varying(position) for position in range(len(first)))
    return shapes if any(shape is not None for shape in shapes) else None


def calibrate(prepared: nn.Module, batches: Iterable[object]) -> None:
    """Run every batch through ``prepared`` in eval mode, without gradients: its observers see them."""
    with eval_mode(prepared), torch.no_grad():
        for batch in batches:
            run_batch(prepared, batch)


def prepared(
    flow: str, model: nn.Module, config: object, example: tuple[Any, ...], shapes: Any, equalization: Any
) -> tuple[nn.Module, TorchFlow]:
    """:func:`~qinsight.apply.torch_flows.prepare_config`, its failures (tracing, export, a quantizer
    refusing a pattern: torch's errors have no common base) said as one :class:`FrontendError`."""
    try:
        return prepare_config(model, config, example, shapes, equalization)
    except Exception as exc:
        raise FrontendError(
            f"the {flow} flow cannot prepare {type(model).__name__}: {type(exc).__name__}: {exc}"
        ) from exc


def quantize_with(
    model: nn.Module,
    advice: Advice,
    calibration: Sequence[object],
    quantizer: object | None = None,
    runs_on: Sequence[object] = (),
) -> nn.Module:
    """``model`` quantized with ``advice`` through its flow (on top of the user's ``quantizer``, where
    given): its biases corrected and smoothed first where the advice says so, prepared, calibrated on
    ``calibration`` and converted.
    An exported model takes every input shape among ``calibration`` and ``runs_on`` (the batches it is
    run on after)."""
    if not calibration:
        raise InvalidParameterError("quantize", "calibration_data", "no batches", "at least one batch")
    for note in advice.notes:
        if note.kind not in _DONE_HERE:
            warnings.warn(NoteWarning(note), stacklevel=3)
    smoothed = apply_smoothing(apply_bias_correction(model, advice.bias_correction), advice.smoothing)
    spec = flow_spec(advice.flow)
    equalization = equalization_qconfig_mapping(advice.equalization) if spec.equalizes else None
    shapes = varying_shapes([*calibration, *runs_on]) if spec.exports else None
    ready, flow = prepared(
        advice.flow, smoothed, torch_config(advice, quantizer), example_inputs(calibration[0]), shapes, equalization
    )
    calibrate(ready, calibration)
    return flow.convert(ready)


__all__ = [
    "calibrate",
    "default_config",
    "prepared",
    "quantize_with",
    "torch_config",
    "varying_shapes",
]
