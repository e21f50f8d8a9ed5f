"""A :class:`~qinsight.core.bias.BiasCorrection` applied to a torch model: each shift subtracted from a bias.

The model keeps its structure and names: a shift measured through a folded
BatchNorm goes into that BatchNorm's bias (the flow folds it into the layer's
int32 bias as before), any other into the layer's own bias, created (zeros)
where the layer has none.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from qinsight.core.bias import BiasCorrection, BiasShift
from qinsight.core.errors import InvalidParameterError

_TAKERS = (nn.Linear, nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm)


def _channels(module: nn.Module) -> int:
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, nn.modules.conv._ConvNd):
        return module.out_channels
    return int(getattr(module, "num_features", 0))


def _checked(modules: dict[str, nn.Module], entry: BiasShift) -> None:
    found = modules.get(entry.into)
    if not isinstance(found, _TAKERS):
        what = "no module" if found is None else type(found).__name__
        expected = "the name of a Linear, Conv or BatchNorm of the model"
        raise InvalidParameterError("bias_corrected", "into", f"{entry.into} ({what})", expected)
    if isinstance(found, nn.modules.batchnorm._BatchNorm) and found.bias is None:
        raise InvalidParameterError(
            "bias_corrected", "into", f"{entry.into} (no affine bias)", "a BatchNorm with a bias"
        )
    if _channels(found) != len(entry.shift):
        got = f"{len(entry.shift)} shifts for {entry.into}"
        raise InvalidParameterError("bias_corrected", "shift", got, f"{_channels(found)}, its output channels")


def apply_bias_correction(model: nn.Module, correction: BiasCorrection) -> nn.Module:
    """A copy of ``model`` with each bias of ``correction`` shifted; ``model`` itself when there is
    none. A name that is no Linear, Conv or BatchNorm of ``model``, or shifts that do not match its
    channels, are refused before anything is copied."""
    if not correction.entries:
        return model
    modules = dict(model.named_modules())
    for entry in correction.entries:
        _checked(modules, entry)
    corrected = copy.deepcopy(model)
    with torch.no_grad():
        for entry in correction.entries:
            module = corrected.get_submodule(entry.into)
            bias: torch.Tensor | None = getattr(module, "bias", None)
            if bias is None:  # a Linear/Conv without one (checked): the correction is its bias
                like = module.get_parameter("weight")
                bias = nn.Parameter(torch.zeros(len(entry.shift), dtype=like.dtype, device=like.device))
                module.bias = bias
            bias.sub_(torch.tensor(entry.shift, dtype=torch.float64).to(bias))
    return corrected


__all__ = ["apply_bias_correction"]
