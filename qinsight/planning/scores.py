"""How a quantized model's outputs score against the float model's on the evaluation data.

Built-in metrics, as comparisons define them (their direction from the one table)
(:mod:`qinsight.core.metrics`), over every output row at once: ``sqnr`` (dB;
+inf for outputs identical to the float model's), ``cosine`` (of the
flattened outputs), ``top1`` (the fraction of rows whose argmax agrees). A metric function of one's own gets the float
and the quantized outputs, one entry per evaluation batch, and returns a
number (labelled accuracy, a task score...). Every run also gives its noise,
which adds up across sites where their errors are independent, the ranking
the plan orders sites by: the output error's power relative to the output's,
and for ``top1`` also the share of each row's margin the error moves.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from qinsight.compare.metric_functions import kl_per_position, load_metric, sqnr
from qinsight.compare.outputs import floating_leaves, output_rows
from qinsight.core.errors import InvalidParameterError, QinsightError
from qinsight.core.metrics import higher_is_better, spec_of
from qinsight.core.notes import Note, NoteKind
from qinsight.core.plan import Budget, Target

MetricFunction = Callable[[Sequence[Any], Sequence[Any]], float]


def spec_reads(name: str) -> str:
    """What a metric reads a model's outputs as (:attr:`MetricSpec.reads`); a plugin's: rows."""
    spec = spec_of(name)
    return spec.reads if spec is not None else "rows"


def metric_direction(name: str) -> bool:
    """Whether higher is better for the metric called ``name``: the one table's word, a plugin metric's
    own; a function of one's own: higher."""
    if spec_of(name) is not None:
        return higher_is_better(name)
    try:
        return load_metric(name).higher_is_better
    except QinsightError:
        return True


OUTPUT_NOISE, MARGIN_NOISE = "output noise", "top-1 margins"  # the orders a search can take sites in


SCORES: tuple[str, ...] = (
    "sqnr",
    "cosine",
    "top1",
    "kl",
    "token_agreement",
    "perplexity",
)  # a plan's built-in metrics, from the one table; a plugin's (qinsight.metrics) are scored on rows
PER_POSITION = tuple(
    name for name in SCORES if spec_reads(name) != "rows"
)  # read a language model's logits: per position over the last dimension


def logits_of(output: Any, *, detach: bool = True) -> torch.Tensor:
    """A language model's logits in ``output``: its ``logits`` (Hugging Face outputs), else its first
    floating tensor, as (positions, vocabulary) rows (``detach=False``: the gradient flows through them)."""
    logits = getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor):
        logits = floating_leaves(output)[0]
    return (logits.detach() if detach else logits).float().reshape(-1, logits.shape[-1] if logits.dim() else 1)


def next_tokens(logits: torch.Tensor, batches: Sequence[Any]) -> torch.Tensor:
    """The next-token labels of ``logits`` (:func:`logits_of` rows): each batch's own token ids shifted
    by one, ``-100`` (ignored) at each sequence's last position. A batch that is not a tensor of token
    ids with the logits' positions is one :class:`InvalidParameterError`."""
    labels = []
    for batch in batches:
        if not isinstance(batch, torch.Tensor) or batch.is_floating_point() or batch.dim() == 0:
            raise InvalidParameterError(
                "plan",
                "evaluation_data",
                type(batch).__name__,
                "tensors of token ids for perplexity (its labels are the next tokens)",
            )
        shifted = torch.full_like(batch, -100)
        shifted[..., :-1] = batch[..., 1:]
        labels.append(shifted.reshape(-1))
    found = torch.cat(labels)
    if found.numel() != logits.shape[0]:
        raise InvalidParameterError(
            "plan", "evaluation_data", f"{found.numel()} tokens", f"one per logits row ({logits.shape[0]})"
        )
    return found


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The mean next-token cross entropy (nats) of ``logits`` rows against ``labels``."""
    return float(torch.nn.functional.cross_entropy(logits.double(), labels, ignore_index=-100))


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each labelled next token's cross entropy (nats, float64), in token order."""
    kept = labels != -100
    return torch.nn.functional.cross_entropy(logits[kept].double(), labels[kept], reduction="none")


Gather = Callable[[list[Any]], list[Any]]  # one process's outputs per batch -> every batch's, in order
Verdict = tuple[float, int]  # a score, and the first batches it was certain on (0: every batch scored)


def _as_given(outputs: list[Any]) -> list[Any]:
    return outputs


class Scorer:
    """Scores outputs against the float model's ``reference`` outputs (one entry per batch);
    ``perplexity`` also reads the evaluation ``inputs`` (token ids: its labels are the next tokens).
    ``gather`` (``None``: one process scores every batch): where a plan runs over ranks, each scores a
    share of the batches, and the outputs scored are every rank's, in the batches' order
    (:class:`~qinsight.planning.plan_ranks.Ranks`): each rank computes the score one process would;
    ``reference`` and ``inputs`` are every batch's."""

    def __init__(
        self,
        reference: Sequence[Any],
        metric: str | MetricFunction,
        name: str,
        inputs: Sequence[Any] = (),
        gather: Gather | None = None,
    ) -> None:
        self._all = gather or _as_given
        spec = spec_of(metric) if isinstance(metric, str) else None
        self.reads = spec.reads if spec is not None else "rows"
        # a metric computed on the output rows: a built-in's or a plugin's (a labelled one reads its labels)
        self._computed = load_metric(metric) if isinstance(metric, str) and self.reads != "labels" else None
        self.reference = list(reference)
        self.metric, self.name = metric, name
        self.rows = self._matrix(reference)  # a language model's: one row per position
        self._margins = TopMargins(self.rows) if spec is not None and spec.margins else None
        self._reference_log: torch.Tensor | None = None
        self._reference_losses: torch.Tensor | None = None  # perplexity's float token losses, once
        self._labels = next_tokens(self.rows, inputs) if self.reads == "labels" else None
        self._loss = _loss(self.rows, self._labels) if self._labels is not None else 0.0
        # a score of the first batches bounds the whole one (MetricSpec.settles)
        self._settles = spec is not None and spec.settles
        self._whole = gather is None  # this process scores every batch: it can stop a config early

    def _matrix(self, outputs: Sequence[Any]) -> torch.Tensor:
        """``outputs`` as one matrix: a language model's logits one row per position (batches of any
        length), else one row per sample (:func:`output_rows`)."""
        if self.reads != "rows":
            return torch.cat([logits_of(output) for output in outputs])
        return torch.cat([output_rows(output) for output in outputs])

    @property
    def float_perplexity(self) -> float:
        """The float model's own perplexity on the evaluation tokens (NaN unless the metric is ``perplexity``)."""
        return math.exp(self._loss) if self._labels is not None else math.nan

    def damage(self, outputs: Sequence[Any]) -> float:
        """What a quantization does to ``outputs``, in a unit that adds up over layers whose errors are
        independent: a language model's mean KL of the next-token distributions (nats), else the output
        error's power over the output's."""
        outputs = self._all(list(outputs))
        if self.reads != "rows":
            if self._reference_log is None:  # the float distributions, once: a plan takes hundreds of damages
                self._reference_log = torch.log_softmax(self.rows, dim=1)
            per_position = kl_per_position(self._reference_log, torch.log_softmax(self._matrix(outputs), dim=1))
            return max(0.0, float(per_position.double().mean()))
        return self._noise(outputs)[OUTPUT_NOISE]

    def __call__(self, outputs: Sequence[Any]) -> float:
        return self._score(self._all(list(outputs)), None)

    def _score(self, outputs: Sequence[Any], rows: torch.Tensor | None) -> float:
        """The score of ``outputs``; ``rows``: their :meth:`_matrix`, where made already."""
        if not isinstance(self.metric, str):
            return float(self.metric(self.reference, outputs))
        rows = self._matrix(outputs) if rows is None else rows
        if self._labels is not None:
            return math.exp(_loss(rows, self._labels) - self._loss)
        if self._computed is None:
            raise InvalidParameterError("plan", "metric", self.name, "a metric the plan can compute")
        return self._computed.on_tensors(self.rows, rows)

    def best_case(self, outputs: Sequence[Any]) -> float | None:
        """The best score ``outputs`` (of the first batches, in order) can reach once every batch has run:
        their score with the batches still to run as the float model's own outputs (a metric that
        :attr:`~qinsight.core.metrics.MetricSpec.settles`: the more batches run, the lower it is).
        ``None`` where that bounds nothing: a metric that does not settle, a function of one's own, a
        share of the batches (ranks), every batch run."""
        if not (self._settles and self._whole) or not 0 < len(outputs) < len(self.reference):
            return None
        return self._with_reference(list(outputs))

    def _with_reference(self, gathered: list[Any]) -> float:
        return self._score([*gathered, *self.reference[len(gathered) :]], None)

    def settled(self, outputs: Sequence[Any], met: Callable[[float], bool]) -> Verdict | None:
        """Where ``outputs`` of the first batches (fewer than all) miss already for certain (their
        :meth:`best_case` does not ``met``): that best case and how many batches; else ``None``. What a
        process stops a config at: :meth:`verdict` gives the same record where it did not stop."""
        best = self.best_case(outputs)
        return (best, len(outputs)) if best is not None and not met(best) else None

    def verdict(self, outputs: Sequence[Any], met: Callable[[float], bool]) -> Verdict:
        """``outputs`` on every batch scored, with ``0``; or, for a metric that settles and a miss, where
        the miss was certain first: the best case on those first batches and how many (:meth:`settled`'s
        record, whether this process stopped there or, holding a share of the batches, ran on)."""
        gathered = self._all(list(outputs))
        score = self._score(gathered, None)
        if self._settles and not met(score):
            for count in range(1, len(gathered)):  # the best case only falls as batches are added
                best = self._with_reference(gathered[:count])
                if not met(best):
                    return best, count
        return score, 0

    def bounded(self, outputs: Sequence[Any], confidence: float | None) -> tuple[float, float]:
        """The score of ``outputs`` and the pessimistic end of its one-sided ``confidence`` interval
        (:func:`pessimistic_bound`) over the positions the metric averages (its
        :attr:`~qinsight.plugin.Metric.per_position`, perplexity's token losses); NaN where the metric is
        not such a mean, or ``confidence`` is ``None``."""
        computed, labels, outputs = self._computed, self._labels, self._all(list(outputs))
        if confidence is not None and computed is not None and computed.per_position is not None:
            rows = self._matrix(outputs)
            values = computed.per_position(self.rows, rows)
            bound = pessimistic_bound(values, confidence, higher_is_better=computed.higher_is_better)
            return self._score(outputs, rows), bound
        if confidence is not None and labels is not None:  # perplexity: exp(mean difference of the token losses)
            rows = self._matrix(outputs)
            if self._reference_losses is None:  # the float model's, once: a plan scores hundreds of runs
                self._reference_losses = _token_losses(self.rows, labels)
            values = _token_losses(rows, labels) - self._reference_losses
            return self._score(outputs, rows), math.exp(pessimistic_bound(values, confidence, higher_is_better=False))
        return self._score(outputs, None), math.nan

    @property
    def orders(self) -> tuple[str, ...]:
        """The noises the search may order sites by: the output's, and for ``top1`` the margins' too."""
        return (OUTPUT_NOISE, MARGIN_NOISE) if self._margins is not None else (OUTPUT_NOISE,)

    def with_noise(self, outputs: Sequence[Any]) -> tuple[float, dict[str, float]]:
        """The score of ``outputs`` and their :meth:`noise`."""
        outputs = self._all(list(outputs))
        return self._score(outputs, None), self._noise(outputs)

    def noise(self, outputs: Sequence[Any]) -> dict[str, float]:
        """Each of :attr:`orders`' noise in ``outputs``: the output error's power over the output's,
        ``10 ** (-SQNR / 10)``, and for ``top1`` :func:`margin_noise`."""
        return self._noise(self._all(list(outputs)))

    def _noise(self, outputs: Sequence[Any]) -> dict[str, float]:
        rows = self._matrix(outputs)
        found = {OUTPUT_NOISE: math.pow(10.0, -sqnr(self.rows, rows) / 10.0)}
        if self._margins is not None:
            found[MARGIN_NOISE] = self._margins.noise(rows)
        return found


def pessimistic_bound(values: torch.Tensor, confidence: float, *, higher_is_better: bool) -> float:
    """The end of the one-sided ``confidence`` interval of ``values``' mean that is worst for the metric:
    its mean minus (higher is better) or plus ``z`` standard errors, NaN for fewer than four values.

    Neighbouring tokens' errors are correlated (one hard word spoils the next few), so the standard
    error is the batch-means one: the values in order cut into about ``sqrt(n)`` blocks of about
    ``sqrt(n)`` consecutive values, the spread of the block means over ``sqrt(blocks)``; a normal ``z``.
    """
    n = int(values.numel())
    if n < 4:
        return math.nan
    blocks = torch.stack([block.mean() for block in torch.tensor_split(values.double(), math.isqrt(n))])
    error = float(blocks.std()) / math.sqrt(blocks.numel())
    z = statistics.NormalDist().inv_cdf(confidence)
    mean = float(values.double().mean())
    return mean - z * error if higher_is_better else mean + z * error


def wilson_lower(agreeing: int, rows: int, confidence: float) -> float:
    """The lower end of Wilson's one-sided ``confidence`` interval for the proportion ``agreeing / rows``.

    Unlike the normal interval it stays below 1 where every row agrees: a top-1 agreement of 32 of 32
    bounds rows like them at 0.922 (95%), so a target of 0.93 needs at least 36 rows.
    """
    z = statistics.NormalDist().inv_cdf(confidence)
    share, spread = agreeing / rows, z * z / rows
    half_width = z * math.sqrt(share * (1.0 - share) / rows + spread / (4.0 * rows))
    if agreeing == 0:  # exactly 0: the formula's two terms cancel, to a rounding above it
        return 0.0
    return (share + spread / 2.0 - half_width) / (1.0 + spread)


def agreeing_needed(threshold: float, rows: int, confidence: float) -> int | None:
    """The fewest of ``rows`` rows whose top-1 agreement bounds it at ``threshold`` or more
    (:func:`wilson_lower`), or ``None`` where all of them do not."""
    return next((k for k in range(rows + 1) if wilson_lower(k, rows, confidence) >= threshold), None)


def rows_needed(threshold: float, confidence: float) -> int | None:
    """The fewest rows that, all agreeing, bound top-1 at ``threshold`` (n / (n + z²) >= threshold);
    ``None`` for a threshold of 1, which no sample bounds."""
    if threshold >= 1.0:
        return None
    z = statistics.NormalDist().inv_cdf(confidence)
    return max(1, math.ceil(z * z * threshold / (1.0 - threshold) - 1e-9))


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


def held_out_miss(goal: Target, data: str, met: bool, score: float, held_out: float) -> tuple[Note, ...]:
    """The note of a config that meets ``goal`` on the ``data`` it was chosen on (``met``, at ``score``)
    but not on the held-out data; none otherwise."""
    if not met or goal.met(held_out):
        return ()
    said = f"the config meets {goal} on the {data} data ({score:.4g}) but not on the held-out data ({held_out:.4g})"
    return (Note(NoteKind.HELD_OUT_MISS, said),)


def scored_metric(owner: str, name: str, goal: Target | Budget | None, given: bool, functions: bool = True) -> None:
    """``name`` checked as a metric ``owner`` (a planner) can score: a built-in, or a plugin's
    (``qinsight.metrics``) bounded the way it says is better; else one :class:`InvalidParameterError`
    (``given``: the user named it as ``metric``, else it is the target's; ``functions``: the owner takes
    a function of one's own too)."""
    if name in SCORES:
        return
    try:
        plugin = load_metric(name)
    except QinsightError:
        known = f"one of {', '.join(SCORES)}, a plugin metric (qinsight.metrics)"
        if given or not functions:
            expected = f"{known} or a function" if functions else known
            raise InvalidParameterError(owner, "metric", name, expected) from None
        expected = f"a function scoring the outputs for the target's {name!r} ({known})"
        raise InvalidParameterError(owner, "metric", None, expected) from None
    if isinstance(goal, Target) and goal.metric == name and goal.higher_is_better != plugin.higher_is_better:
        wanted = ">=" if plugin.higher_is_better else "<="
        expected = f"{name}{wanted}N: the plugin says {name} is bounded so"
        raise InvalidParameterError(owner, "target", str(goal), expected)


__all__ = [
    "scored_metric",
    "held_out_miss",
    "MARGIN_NOISE",
    "PER_POSITION",
    "metric_direction",
    "spec_reads",
    "agreeing_needed",
    "pessimistic_bound",
    "rows_needed",
    "wilson_lower",
    "SCORES",
    "logits_of",
    "OUTPUT_NOISE",
    "MetricFunction",
    "Scorer",
    "TopMargins",
    "Verdict",
    "margin_noise",
]
