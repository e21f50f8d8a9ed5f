"""How a quantized model's outputs score against the float model's on the evaluation data.

Built-in metrics (higher is better): ``sqnr`` (dB, over all outputs),
``cosine`` (mean per row, e.g. per sentence embedding), ``top1`` (the fraction
of rows whose argmax agrees). A metric function of one's own gets the float
and the quantized outputs, one entry per evaluation batch, and returns a
number (labelled accuracy, a task score...). Every run also gives its noise,
which adds up across sites where their errors are independent, the ranking
the plan orders sites by: the output error's power relative to the output's,
and for ``top1`` also the share of each row's margin the error moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from qinsight.compare.metrics import sqnr
from qinsight.core.errors import InvalidParameterError

MetricFunction = Callable[[Sequence[Any], Sequence[Any]], float]
OUTPUT_NOISE, MARGIN_NOISE = "output noise", "top-1 margins"  # the orders a search can take sites in


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
        self._margins = TopMargins(self.rows) if metric == "top1" else None

    def __call__(self, outputs: Sequence[Any]) -> float:
        if isinstance(self.metric, str):
            measure = BUILTIN[self.metric]
            return float(measure(self.rows, torch.cat([output_rows(output) for output in outputs])))
        return float(self.metric(self.reference, outputs))

    @property
    def orders(self) -> tuple[str, ...]:
        """The noises the search may order sites by: the output's, and for ``top1`` the margins' too."""
        return (OUTPUT_NOISE, MARGIN_NOISE) if self.metric == "top1" else (OUTPUT_NOISE,)

    def noise(self, outputs: Sequence[Any]) -> dict[str, float]:
        """Each of :attr:`orders`' noise in ``outputs``: the output error's power over the output's,
        ``10 ** (-SQNR / 10)``, and for ``top1`` :func:`margin_noise`."""
        rows = torch.cat([output_rows(output) for output in outputs])
        found = {OUTPUT_NOISE: math.pow(10.0, -_sqnr(self.rows, rows) / 10.0)}
        if self._margins is not None:
            found[MARGIN_NOISE] = self._margins.noise(rows)
        return found


class TopMargins:
    """The reference's top class per row and its margin over the best other class, taken once: each
    candidate's :meth:`noise` reads them (a search scores hundreds of runs against one reference)."""

    def __init__(self, reference: torch.Tensor) -> None:
        self.top = reference.argmax(dim=1, keepdim=True)
        self.margin = self._of(reference)

    def _of(self, rows: torch.Tensor) -> torch.Tensor:
        others = rows.double().scatter(1, self.top, -math.inf).amax(dim=1)
        return rows.double().gather(1, self.top).squeeze(1) - others

    def noise(self, candidate: torch.Tensor) -> float:
        """Per row, how far ``candidate`` moves the margin, as a share of it, squared (at most 1: the
        row flipped); the mean."""
        moved = (self.margin - self._of(candidate)) / self.margin.clamp_min(1e-12)
        return float(moved.square().clamp(max=1.0).mean())


def margin_noise(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """Per row, how far ``candidate`` moves the margin between the reference's top class and its
    best other class, as a share of that margin, squared (at most 1: the row flipped); the mean.

    Top-1 flips where the error crosses a row's margin, so a row with a wide margin takes noise
    that flips a narrow one: the output's SQNR weighs them alike and orders sites by error that
    never changes a prediction. Squared shares add up across sites whose errors are independent.
    """
    return TopMargins(reference).noise(candidate)


__all__ = ["BUILTIN", "MARGIN_NOISE", "OUTPUT_NOISE", "MetricFunction", "Scorer", "TopMargins", "margin_noise", "output_rows"]
