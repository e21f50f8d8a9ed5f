"""How a quantized model's outputs score against the float model's on the evaluation data.

Built-in metrics (higher is better): ``sqnr`` (dB, over all outputs),
``cosine`` (mean per row, e.g. per sentence embedding), ``top1`` (the fraction
of rows whose argmax agrees). A metric function of one's own gets the float
and the quantized outputs, one entry per evaluation batch, and returns a
number (labelled accuracy, a task score...). Every run also gives its noise:
the output error's power relative to the output's, which adds up across
sites where their errors are independent, the ranking the plan orders sites by.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from qinsight.compare.metrics import sqnr
from qinsight.core.errors import InvalidParameterError

MetricFunction = Callable[[Sequence[Any], Sequence[Any]], float]


def output_rows(output: Any) -> torch.Tensor:
    """A model output as one float matrix (one row per sample): every floating tensor in it, flattened."""
    leaves = torch.utils._pytree.tree_leaves(output)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise InvalidParameterError("plan", "model output", type(output).__name__, "at least one floating tensor")
    rows = [t.detach().float().reshape(t.shape[0] if t.dim() else 1, -1) for t in tensors]
    return torch.cat(rows, dim=1) if len(rows) > 1 else rows[0]


def _sqnr(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """The comparison's SQNR, capped: a plan's scores are finite (bit-identical reads 200 dB)."""
    return max(-200.0, min(200.0, sqnr(reference, candidate)))


def _cosine(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(reference.double(), candidate.double(), dim=1).mean())


def _top1(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    return float((reference.argmax(dim=1) == candidate.argmax(dim=1)).double().mean())


BUILTIN: dict[str, Callable[[torch.Tensor, torch.Tensor], float]] = {"sqnr": _sqnr, "cosine": _cosine, "top1": _top1}


class Scorer:
    """Scores outputs against the float model's ``reference`` outputs (one entry per batch)."""

    def __init__(self, reference: Sequence[Any], metric: str | MetricFunction, name: str) -> None:
        if isinstance(metric, str) and metric not in BUILTIN:
            raise InvalidParameterError("plan", "metric", metric, f"one of {', '.join(BUILTIN)} or a function")
        self.reference = list(reference)
        self.rows = torch.cat([output_rows(output) for output in reference])
        self.metric, self.name = metric, name

    def __call__(self, outputs: Sequence[Any]) -> float:
        if isinstance(self.metric, str):
            measure = BUILTIN[self.metric]
            return float(measure(self.rows, torch.cat([output_rows(output) for output in outputs])))
        return float(self.metric(self.reference, outputs))

    def noise(self, outputs: Sequence[Any]) -> float:
        """The output error's power over the output's: ``10 ** (-SQNR / 10)``."""
        return math.pow(10.0, -_sqnr(self.rows, torch.cat([output_rows(output) for output in outputs])) / 10.0)


__all__ = ["BUILTIN", "MetricFunction", "Scorer", "output_rows"]
