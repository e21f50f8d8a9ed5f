"""A :class:`~qinsight.core.smoothing.SmoothingMapping` applied to a torch model.

Each smoothed Linear becomes a :class:`SmoothedLinear`: the input multiplied by
``1 / factors`` in float, then the same Linear with its weight's columns
multiplied by ``factors``. In float the model computes what it did (up to
rounding); quantized, the Linear's input has the flatter channels. FX and
torch.export trace through the wrapper (it is not a ``torch.nn`` module), so
the multiplication is a functional call named ``<fqn>.mul#0`` and the Linear a
module named ``<fqn>.linear``; keep the multiplication in float (a plan does).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from qinsight.core.errors import InvalidParameterError
from qinsight.core.smoothing import SmoothingMapping


class SmoothedLinear(nn.Module):
    """``linear(x / factors)``, with ``factors`` folded into ``linear``'s weight columns: ``linear``
    is taken over and its weight scaled in place (pass a copy to keep the original)."""

    inverse_factors: torch.Tensor

    def __init__(self, linear: nn.Linear, factors: torch.Tensor) -> None:
        super().__init__()
        self.linear = linear
        with torch.no_grad():
            self.linear.weight.mul_(factors.to(linear.weight))
        self.register_buffer("inverse_factors", (1.0 / factors).to(linear.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x * self.inverse_factors)
        return out


def apply_smoothing(model: nn.Module, mapping: SmoothingMapping) -> nn.Module:
    """A copy of ``model`` with each Linear of ``mapping`` smoothed; ``model`` itself when the
    mapping is empty. A name that is not a Linear of ``model``, or factors that do not match its
    input channels, are refused before anything is copied."""
    if not mapping.entries:
        return model
    modules = dict(model.named_modules())
    for entry in mapping.entries:
        found = modules.get(entry.fqn)
        if type(found) is not nn.Linear or not entry.fqn:  # the model itself cannot be replaced in place
            what = "no module" if found is None else type(found).__name__
            raise InvalidParameterError(
                "smoothing", "fqn", f"{entry.fqn} ({what})", "the name of an nn.Linear of the model"
            )
        if found.in_features != len(entry.factors):
            raise InvalidParameterError(
                "smoothing",
                f"factors of {entry.fqn}",
                f"{len(entry.factors)} factors",
                f"{found.in_features}, its input channels",
            )
    smoothed = copy.deepcopy(model)  # the one copy: each SmoothedLinear takes over its Linear from it
    for entry in mapping.entries:
        parent_name, _, child = entry.fqn.rpartition(".")
        parent = smoothed.get_submodule(parent_name)
        linear = getattr(parent, child)
        setattr(parent, child, SmoothedLinear(linear, torch.tensor(entry.factors, dtype=torch.float64)))
    return smoothed


__all__ = ["SmoothedLinear", "apply_smoothing"]
