"""Bias correction measured: the mean shift a config's quantized weights add to each layer's output.

:func:`measure_bias_correction` quantizes the model with the config for real
(``qinsight.quantize``'s recipe), reads each quantized layer's weight from the
converted model (what the flow computes with, BatchNorm folded where it folded
it), and runs the float model on the calibration batches once: at each layer,
its float input through the weight's error alone, ``layer(x; W_q - W)``
without bias. The layer is linear in its weight, so that is the shift of its
output, exactly, on that data, padding and strides included. Each layer is
measured on the float model's own input, so the shifts do not depend on one
another and one pass measures them all (the empirical bias correction of
Nagel et al., 2019; NNCF's fast bias correction measures the same on float
inputs).

Per batch, a layer's shift is its mean over the batch's samples (a conv's
positions first averaged within each sample; a Linear's rows), shrunk toward
zero by its noise (James-Stein on the channels' standardized means,
:func:`shrunk_mean`): a classifier's thousand logits averaged over eight images
drift mostly by chance, a depthwise conv's channels by how its rounding leans.
The sums stay on the device; each layer's shift is read once, at the end.

Measured and left out: correcting the converted graph's whole drift (what
reaches a layer through the activations before it too), each layer in flight
after the ones before it. On MobileNetV2 it scored below this estimator on
unseen crops for XNNPACK and x86 alike (docs/verification.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch import nn
from torch.nn import functional as F

from qinsight.apply.recipe import quantize_with
from qinsight.compare.layers import QuantizedLayer, quantized_layers
from qinsight.compare.weights import reference_weight
from qinsight.core.advice import Advice
from qinsight.core.bias import BiasCorrection, BiasShift
from qinsight.frontends import ModelStructure, eval_mode, model_structure, run_batch

# the layers whose output a weight error reaches through their forward alone (a subclass may pad or
# reshape in its own forward: its shift is not measured through the parent's)
_MEASURED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _per_sample(output: torch.Tensor, linear: bool) -> torch.Tensor:
    """``output``'s channel means per sample, float64: (samples, channels); a Linear's every row a
    sample, a conv's positions averaged within each of its batch's samples."""
    if linear:
        return output.double().reshape(-1, output.shape[-1])
    return output.double().flatten(2).mean(2) if output.dim() > 2 else output.double()


def shrunk_mean(samples: torch.Tensor) -> torch.Tensor:
    """The channels' means over ``samples`` (samples, channels), shrunk toward zero together by how far
    they stand out of their standard errors (positive-part James-Stein: ``m * max(0, 1 - (C - 2) / sum
    t²)``, ``t`` a channel's mean over its standard error; with two channels or fewer, each by its own
    ``1 - 1 / t²``); zero where one sample gives no error to judge by."""
    mean = samples.mean(0)
    if samples.shape[0] < 2:
        return torch.zeros_like(mean)
    tiny = torch.finfo(mean.dtype).tiny
    signal = mean.square() / (samples.var(0) / samples.shape[0]).clamp_min(tiny)
    channels = mean.numel()
    if channels <= 2:
        return mean * (1.0 - 1.0 / signal.clamp_min(tiny)).clamp_min(0.0)
    return mean * (1.0 - (channels - 2) / signal.sum().clamp_min(tiny)).clamp_min(0.0)


@attrs.define
class _Layer:
    """One layer being measured: where its bias goes, its weight's error, its float output's statistics
    and its batches' shifts."""

    fqn: str
    into: str  # the module whose output the shift is in: the layer, or the BatchNorm folded into it
    linear: bool
    # the folded BatchNorm's per-channel scale (ones without one): its output's spread is the layer's times it
    scale: torch.Tensor
    error: torch.Tensor  # the weight's error, folded where the flow folds a BatchNorm into it
    shrink: bool = True  # each batch's shift shrunk by its noise (off: the plain mean, for tests)
    shifts: list[torch.Tensor] = attrs.field(factory=list)  # a batch each
    float_sum: torch.Tensor | None = None
    float_squares: torch.Tensor | None = None
    float_count: int = 0

    def hook(self, module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        """The float layer's forward hook: its output's statistics, and its input through the weight's
        error (folded: the error of the folded weight gives the BatchNorm's output's shift)."""
        values = output.double().movedim(-1 if self.linear else 1, -1).reshape(-1, len(self.scale))
        self.float_sum = _added(self.float_sum, values.sum(0))
        self.float_squares = _added(self.float_squares, values.square().sum(0))
        self.float_count += values.shape[0]
        samples = _per_sample(_through_error(module, args[0], self.error), self.linear)
        self.shifts.append(shrunk_mean(samples) if self.shrink else samples.mean(0))

    def shift(self, batches: int) -> BiasShift | None:
        """The mean of the ``batches``' shifts; ``None`` unless the layer was called once a batch (a module
        called twice has one bias for calls that shift apart)."""
        if self.float_sum is None or self.float_squares is None or len(self.shifts) != batches:
            return None
        mean = torch.stack(self.shifts).mean(0)
        if not bool(mean.any()):
            return None  # every batch's shift within its noise: nothing to correct
        float_mean = self.float_sum / self.float_count
        spread = (self.float_squares / self.float_count - float_mean.square()).clamp_min(0.0).sqrt() * self.scale.abs()
        relative = torch.where(spread > 0, mean / spread.clamp_min(1e-30), torch.zeros_like(mean))
        size = float(relative.square().mean().sqrt())
        return BiasShift(fqn=self.fqn, into=self.into, shift=tuple(mean.tolist()), size=size)


def _added(total: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    return value if total is None else total + value


def _through_error(module: nn.Module, x: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
    if isinstance(module, nn.modules.conv._ConvNd):
        shifted: torch.Tensor = module._conv_forward(x, error.to(x.dtype), None)
        return shifted
    return F.linear(x, error.to(x.dtype))


def measure_bias_correction(
    model: nn.Module,
    advice: Advice,
    calibration: Sequence[Any],
    quantizer: object | None = None,
    *,
    shrink: bool = True,
) -> BiasCorrection:
    """The bias correction of ``advice``'s config (on top of the user's ``quantizer``, where given): per
    layer the flow quantizes, the mean shift of its output that its quantized weight makes on
    ``calibration`` (the module docstring's). Layers the flow left in float, or whose weight it scaled
    before rounding (equalized), a module called more than once per batch, layers whose own forward
    is not a plain Linear/Conv's and layers whose shift was within its noise on every batch are not
    corrected. The flow's errors are raised as
    :func:`quantize_with` raises them. ``shrink=False`` takes each batch's plain mean."""
    converted = quantize_with(model, advice, calibration, quantizer)
    structure = model_structure(model)
    measured = _layers(model, structure, quantized_layers(model, converted, structure), shrink)
    del converted  # only its weights were needed
    modules = dict(model.named_modules())
    hooks = [modules[layer.fqn].register_forward_hook(layer.hook) for layer in measured]
    try:
        with eval_mode(model), torch.no_grad():
            for batch in calibration:
                run_batch(model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    shifts = (layer.shift(len(calibration)) for layer in measured)
    return BiasCorrection(entries=tuple(shift for shift in shifts if shift is not None))


def _rounds(quantized: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``quantized`` is ``weight`` rounded to an 8-bit grid (or a finer one) over its range: no
    value moved by more than half a step of 255 over twice its largest magnitude. A weight the flow
    scaled before rounding (equalized, or the layer before an equalized one) moved further: its error
    is not the rounding's."""
    largest = float(weight.abs().max())
    return float((quantized - weight).abs().max()) <= largest / 127.0 * (1.0 + 1e-3) + 1e-12


def _bn_scale(model: nn.Module, bn_name: str | None, weight: torch.Tensor) -> torch.Tensor | None:
    """The folded BatchNorm's per-channel scale, float64 (ones without one); ``None`` for a BatchNorm
    without a bias to take the shift."""
    ones = torch.ones(weight.shape[0], dtype=torch.float64, device=weight.device)
    if bn_name is None:
        return ones
    bn = model.get_submodule(bn_name)
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or bn.bias is None or bn.running_var is None:
        return None
    scale = torch.rsqrt(bn.running_var.double() + bn.eps) * (ones if bn.weight is None else bn.weight.double())
    return scale.detach()


def _layers(
    model: nn.Module, structure: ModelStructure, layers: dict[str, QuantizedLayer], shrink: bool
) -> list[_Layer]:
    """The layers to measure, each with its weight's error against the float weight the flow quantized."""
    folds = structure.batchnorm_after_conv()
    found = []
    for fqn, layer in layers.items():
        holder = structure.modules[fqn].holder
        if not layer.quantized or type(holder) not in _MEASURED or structure.modules[fqn].module is not holder:
            continue
        reference = reference_weight(model, structure, folds, layer)
        if reference is None:
            continue
        weight, bn_name = reference
        quantized = layer.weight().detach().float().to(weight.device)
        if quantized.shape != weight.shape or not _rounds(quantized, weight):
            continue  # a layout the flow changed, or a weight it scaled first (FX's equalization)
        scale = _bn_scale(model, bn_name, weight)
        if scale is None:
            continue  # nowhere to put it without changing the model's structure
        linear = isinstance(holder, nn.Linear)
        found.append(_Layer(fqn, bn_name or fqn, linear, scale, quantized - weight, shrink=shrink))
    return found


__all__ = ["measure_bias_correction", "shrunk_mean"]
