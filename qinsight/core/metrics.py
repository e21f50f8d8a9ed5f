"""The metrics qinsight knows by name: one definition each, with its direction and its range.

Comparisons (``compare_*``), plans (targets, scores) and the command line all
read this one table; :mod:`qinsight.compare.metric_functions` gives each its
computation, on whole tensors and, where it has one, from error sums over
batches. Every metric compares a reference (float) tensor with an actual
(quantized) one as a whole: ``cosine`` is the cosine of the two flattened
tensors (torch's Numeric Suite's), ``top1`` the share of rows (first
dimension: samples) whose argmax agrees, ``sqnr`` is +inf for identical
tensors and -inf for an error on a zero reference. ``kl`` and ``token_agreement`` read a language
model's logits: the last dimension is the vocabulary, every other one a position.

Third-party metrics (the ``qinsight.metrics`` entry points) declare their
direction themselves (:class:`~qinsight.plugin.Metric`) and have no range.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import attrs

from qinsight.core.outcomes import FailedConfig, Outcome


@attrs.frozen(kw_only=True)
class MetricSpec:
    """A metric's name, its direction, the values it can take (``lower`` to ``upper``) and what a model's
    outputs are read as to compute it (``reads``): ``"rows"`` one row per sample, ``"positions"`` a
    language model's logits one row per token position, ``"labels"`` those positions and the inputs'
    next tokens as labels. ``margins``: it counts agreeing argmaxes, so a plan may order its sites by the
    noise in the top-1 margins too. ``settles``: a row's error can only make the score worse, so the score
    with the rows not yet run taken as the float model's own is the best the rest can reach: a config
    already short of a target on the rows run so far misses it, and a plan stops running it (cosine
    and perplexity ratios can recover, a function of one's own is unknown: they run every row)."""

    name: str
    higher_is_better: bool
    lower: float = -math.inf
    upper: float = math.inf
    meaning: str = ""
    reads: Literal["rows", "positions", "labels"] = "rows"
    margins: bool = False
    settles: bool = False

    def worse(self, score: Outcome, than: Outcome) -> bool:
        """Whether ``score`` is worse than ``than`` in this metric's direction: a config the flow could
        not build or run is worse than any score; never where a score is NaN (not measured: nothing is
        dropped or replaced on a number that is not there)."""
        if isinstance(score, FailedConfig) or isinstance(than, FailedConfig):
            return isinstance(score, FailedConfig) and not isinstance(than, FailedConfig)
        if math.isnan(score) or math.isnan(than):
            return False
        return score < than if self.higher_is_better else score > than

    def best(self, scores: Iterable[float]) -> float:
        """The best of ``scores`` in this metric's direction."""
        return max(scores) if self.higher_is_better else min(scores)

    def admits(self, value: float) -> bool:
        return self.lower <= value <= self.upper

    def describe_range(self) -> str:
        if math.isfinite(self.lower) and math.isfinite(self.upper):
            return f"between {self.lower:g} and {self.upper:g}"
        return f"at least {self.lower:g}" if math.isfinite(self.lower) else "any number"


METRICS: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        MetricSpec(name="sqnr", higher_is_better=True, meaning="signal-to-quantization-noise ratio, dB", settles=True),
        MetricSpec(name="relative_l2", higher_is_better=False, lower=0.0, meaning="||x - y|| / ||x||", settles=True),
        MetricSpec(
            name="cosine", higher_is_better=True, lower=-1.0, upper=1.0, meaning="cosine of the flattened tensors"
        ),
        MetricSpec(name="max_abs_error", higher_is_better=False, lower=0.0, meaning="max |x - y|", settles=True),
        MetricSpec(name="mse", higher_is_better=False, lower=0.0, meaning="mean (x - y)^2", settles=True),
        MetricSpec(
            name="top1",
            higher_is_better=True,
            lower=0.0,
            upper=1.0,
            meaning="share of rows whose argmax agrees",
            margins=True,
            settles=True,
        ),
        # A language model's logits: the last dimension is the vocabulary, every other one a token position.
        MetricSpec(
            name="kl",
            higher_is_better=False,
            lower=0.0,
            meaning="mean KL divergence of the quantized from the float next-token distribution "
            "(softmax of the last dim), nats",
            reads="positions",
            settles=True,
        ),
        MetricSpec(
            name="token_agreement",
            higher_is_better=True,
            lower=0.0,
            upper=1.0,
            meaning="share of positions whose most likely next token (argmax of the last dim) agrees",
            reads="positions",
            settles=True,
        ),
    )
}
# Metrics of a whole model's outputs that need labels as well: a plan scores them, a layer comparison cannot.
LABELLED: dict[str, MetricSpec] = {
    "perplexity": MetricSpec(
        name="perplexity",
        higher_is_better=False,
        lower=0.0,
        meaning="the quantized model's perplexity on the evaluation tokens' own next tokens "
        "over the float model's (a ratio)",
        reads="labels",
    ),
}
# What comparisons measure unless told otherwise; top1 is for a model's outputs (plans), not a layer's.
COMPARISON_DEFAULT: tuple[str, ...] = ("sqnr", "relative_l2", "cosine", "max_abs_error", "mse")


def spec_of(name: str) -> MetricSpec | None:
    """The spec of a metric by name, a layer comparison's or a labelled one; ``None`` for a name of one's own."""
    return METRICS.get(name) or LABELLED.get(name)


def higher_is_better(name: str) -> bool:
    """The direction of a metric by name; a metric of one's own is taken as higher is better."""
    spec = spec_of(name)
    return spec is None or spec.higher_is_better


def sqnr_of_sums(ref_sq: float, err_sq: float) -> float:
    """SQNR in dB from the sums of x² and of (x - y)²: inf without error, -inf without signal."""
    if err_sq == 0.0:
        return math.inf
    return -math.inf if ref_sq == 0.0 else 10 * math.log10(ref_sq / err_sq)


__all__ = [
    "COMPARISON_DEFAULT",
    "LABELLED",
    "METRICS",
    "MetricSpec",
    "higher_is_better",
    "spec_of",
    "sqnr_of_sums",
]
