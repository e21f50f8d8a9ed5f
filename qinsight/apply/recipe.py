"""The recipe behind ``qinsight.quantize``: what a user does with advice: smooth, prepare, calibrate, convert.

FX: ``prepare_fx(model, mapping, example_inputs, _equalization_config=...)``;
PT2E: ``torch.export`` (every input dimension that differs between the
calibration batches dynamic), then ``prepare_pt2e(exported, quantizer)``. Both
calibrate on every batch in eval mode without gradients, then convert. The
user's model is never changed: the flows prepare a copy.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from qinsight.apply.equalization import equalization_qconfig_mapping
from qinsight.apply.fx import qconfig_mapping
from qinsight.apply.pt2e import pt2e_quantizer
from qinsight.apply.smoothing import apply_smoothing
from qinsight.compare.configs import convert_prepared, prepare_config
from qinsight.core.advice import Advice
from qinsight.core.errors import FrontendError, InvalidParameterError
from qinsight.frontends import eval_mode, example_inputs, run_batch


def torch_config(advice: Advice) -> object:
    """The flow's config for ``advice``: a ``QConfigMapping`` (FX) or a torchao quantizer (PT2E)."""
    return qconfig_mapping(advice) if advice.flow == "fx" else pt2e_quantizer(advice)


def varying_shapes(batches: Sequence[object]) -> tuple[dict[int, Any] | None, ...] | None:
    """``torch.export``'s ``dynamic_shapes`` making every input dimension that differs between
    ``batches`` dynamic (token counts); ``None`` where every batch has one shape."""
    examples = [example_inputs(batch) for batch in batches]
    first = examples[0]

    def varying(position: int) -> dict[int, Any] | None:
        value = first[position]
        if not isinstance(value, torch.Tensor):
            return None
        dims = {
            dim: torch.export.Dim.AUTO
            for dim in range(value.dim())
            if any(isinstance(e[position], torch.Tensor) and e[position].shape[dim] != value.shape[dim] for e in examples)
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
) -> tuple[nn.Module, bool]:
    """:func:`~qinsight.compare.configs.prepare_config`, its failures (tracing, export, a quantizer
    refusing a pattern: torch's errors have no common base) said as one :class:`FrontendError`."""
    try:
        return prepare_config(model, config, example, shapes, equalization)
    except Exception as exc:
        raise FrontendError(f"the {flow} flow cannot prepare {type(model).__name__}: {type(exc).__name__}: {exc}") from exc


def quantize_with(model: nn.Module, advice: Advice, calibration: Sequence[object]) -> nn.Module:
    """``model`` quantized with ``advice`` through its flow: smoothed first where the advice smooths,
    prepared, calibrated on ``calibration`` and converted."""
    if not calibration:
        raise InvalidParameterError("quantize", "calibration_data", "no batches", "at least one batch")
    for note in advice.notes:
        if "smoothed model" not in note:  # quantize smooths the model itself
            warnings.warn(note, stacklevel=3)
    smoothed = apply_smoothing(model, advice.smoothing)
    equalization = equalization_qconfig_mapping(advice.equalization) if advice.flow == "fx" else None
    shapes = varying_shapes(calibration) if advice.flow == "pt2e" else None
    ready, pt2e = prepared(advice.flow, smoothed, torch_config(advice), example_inputs(calibration[0]), shapes, equalization)
    calibrate(ready, calibration)
    return convert_prepared(ready, pt2e)


__all__ = ["calibrate", "prepared", "quantize_with", "torch_config", "varying_shapes"]
