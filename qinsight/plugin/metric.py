"""The metric contract: how a float tensor and its quantized version are compared, and which way is better.

A :class:`Metric` has a name, a direction (``higher_is_better``: SQNR and
cosine; errors such as relative L2 are better lower) and two forms:

- ``on_tensors(reference, actual) -> float`` on whole tensors: a weight, one
  output channel, one batch's activation;
- ``from_totals(ErrorTotals) -> float``, optional: the metric over every batch
  at once, from running sums (O(1) memory per layer). Without it, an
  activation comparison takes the mean of ``on_tensors`` over batches.

A metric that is the mean of a value per position of a language model's
logits (the built-in ``kl`` and ``token_agreement``) gives that value too,
``per_position(reference, actual) -> Tensor`` (one float64 value per row of
the logits, the last dimension the vocabulary): a format plan bounds such a
metric at a confidence over those values.

The direction is what ``worst()``, the best config per layer and the tables
sort by, and it is written into report files with every value, so a file
reads right where the plugin is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import torch

    TensorMetric = Callable[[torch.Tensor, torch.Tensor], float]


@attrs.frozen(kw_only=True)
class ErrorTotals:
    """Sums over every value compared, across all batches, for a reference x and an actual y."""

    ref_sq: float  # sum of x²
    act_sq: float  # sum of y²
    err_sq: float  # sum of (x - y)²
    max_abs: float  # max |x - y|
    count: int  # values compared
    batches: int


@attrs.frozen(kw_only=True)
class Metric:
    name: str
    higher_is_better: bool
    on_tensors: TensorMetric
    from_totals: Callable[[ErrorTotals], float] | None = None
    per_position: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def __call__(self, reference: torch.Tensor, actual: torch.Tensor) -> float:
        return self.on_tensors(reference, actual)
