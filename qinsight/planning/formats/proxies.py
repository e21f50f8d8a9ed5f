"""Cheap rankings of a mixed-format plan's layers, measured against the plan's own end-to-end one.

Each gives a damage per layer and format from the weight error the format makes, ``ΔW = W - Q(W)``
(torchao's own quantized weight, dequantized), without running the model quantized:

- ``fisher``: NVIDIA ModelOpt's ``auto_quantize`` proxy, ``Σ g² ΔW²`` with ``g`` the gradient of the
  loss (one backward pass over the search data: the next-token cross entropy for token inputs, else
  the cross entropy against the float model's own top class);
- ``activation``: the error a layer's output takes for inputs of the observed magnitude, ``Σ_j E[x_j²]
  ‖ΔW[:, j]‖²`` (the diagonal of GPTQ's Hessian; outlier channels weigh their weight columns).

Neither sees what a dynamic format does to the activations: only the measured ranking does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from qinsight.apply.torchao import torchao_config
from qinsight.compare.outputs import output_rows
from qinsight.compare.torchao_weights import dequantized
from qinsight.frontends.base import run_batch
from qinsight.planning.formats.ladders import Rungs
from qinsight.planning.scores import logits_of, next_tokens

Damages = dict[tuple[str, str], float]


def weight_errors(model: nn.Module, layers: Sequence[Rungs]) -> dict[tuple[str, str], torch.Tensor]:
    """``W - Q(W)`` of each layer in each of its formats (float64), through torchao's own ``quantize_``
    of a copy of the layer alone."""
    from torchao.quantization import quantize_

    modules = dict(model.named_modules())
    errors = {}
    for layer in layers:
        weight = modules[layer.fqn].weight.detach()
        for fmt in layer.formats:
            if fmt.is_float:
                errors[(layer.fqn, fmt.name)] = torch.zeros_like(weight, dtype=torch.float64)
                continue
            alone = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
            alone.weight = nn.Parameter(weight.clone(), requires_grad=False)
            quantize_(alone, torchao_config(fmt))
            errors[(layer.fqn, fmt.name)] = weight.double() - dequantized(alone.weight).double()
    return errors


def input_power(model: nn.Module, layers: Sequence[Rungs], batches: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Each layer's mean squared input per input channel over ``batches`` (float64)."""
    modules = dict(model.named_modules())
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(fqn: str) -> Any:
        def record(_module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
            sums[fqn] = sums.get(fqn, 0) + x.square().sum(dim=0)
            counts[fqn] = counts.get(fqn, 0) + x.shape[0]

        return record

    handles = [modules[layer.fqn].register_forward_pre_hook(hook(layer.fqn)) for layer in layers]
    try:
        with torch.no_grad():
            for batch in batches:
                run_batch(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    return {fqn: total / counts[fqn] for fqn, total in sums.items()}


def activation_damage(errors: dict[tuple[str, str], torch.Tensor], power: dict[str, torch.Tensor]) -> Damages:
    return {(fqn, name): float((error.square().sum(dim=0) * power[fqn]).sum()) for (fqn, name), error in errors.items()}


def fisher_damage(
    model: nn.Module, layers: Sequence[Rungs], batches: Sequence[Any], errors: dict[tuple[str, str], torch.Tensor]
) -> Damages:
    """``Σ g² ΔW²`` per layer and format, ``g`` summed over the search batches."""
    modules = dict(model.named_modules())
    weights = [modules[layer.fqn].weight for layer in layers]
    grads = [torch.zeros_like(w, dtype=torch.float64) for w in weights]
    with _grad_on(weights), torch.enable_grad():
        for batch in batches:
            found = torch.autograd.grad(_loss(run_batch(model, batch), batch), weights, allow_unused=True)
            for total, grad in zip(grads, found):
                if grad is not None:
                    total += grad.double()
    squared = {layer.fqn: grad.square() for layer, grad in zip(layers, grads)}
    return {(fqn, name): float((squared[fqn] * error.square()).sum()) for (fqn, name), error in errors.items()}


def _loss(output: Any, batch: Any) -> torch.Tensor:
    """The next-token cross entropy for token ids, else the cross entropy against the float top class."""
    if isinstance(batch, torch.Tensor) and not batch.is_floating_point():
        logits = logits_of(output, detach=False)
        labels = next_tokens(logits, [batch])
        return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)
    rows = output_rows(output, detach=False)
    return torch.nn.functional.cross_entropy(rows, rows.detach().argmax(dim=1))


@contextlib.contextmanager
def _grad_on(weights: Sequence[torch.Tensor]) -> Iterator[None]:
    flags = [w.requires_grad for w in weights]
    try:
        for w in weights:
            w.requires_grad_(True)
        yield
    finally:
        for w, flag in zip(weights, flags):
            w.requires_grad_(flag)


__all__ = ["Damages", "activation_damage", "fisher_damage", "input_power", "weight_errors"]
