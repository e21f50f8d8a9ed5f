"""A model's outputs as one float matrix, whatever their structure (a tensor, a tuple, a Hugging Face
output object): what a plan and the report's verification score against the float model's."""

from __future__ import annotations

from typing import Any

import torch

from qinsight.core.errors import InvalidParameterError


def floating_leaves(output: Any, owner: str = "plan") -> list[torch.Tensor]:
    """Every floating tensor of a model output, in pytree order; at least one (else one
    :class:`InvalidParameterError` of ``owner``)."""
    tensors = [
        t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    if not tensors:
        raise InvalidParameterError(owner, "model output", type(output).__name__, "at least one floating tensor")
    return tensors


def output_rows(output: Any, *, detach: bool = True, owner: str = "plan") -> torch.Tensor:
    """A model output as one float matrix (one row per sample): every floating tensor in it, flattened
    (``detach=False``: the gradient flows through it)."""
    tensors = [t.detach() if detach else t for t in floating_leaves(output, owner)]
    rows = [t.float().flatten(1) if t.dim() > 1 else t.float().reshape(-1, 1) for t in tensors]  # zero rows too
    return torch.cat(rows, dim=1) if len(rows) > 1 else rows[0]


__all__ = ["floating_leaves", "output_rows"]
