"""Error metrics between a reference (float) tensor and an actual (quantized) one.

Each built-in has defined values where torch's ``compute_sqnr`` gives nan or
divides by zero: identical tensors are a perfect match (SQNR +inf, relative
L2 0, cosine 1), and a zero reference with any error has SQNR -inf and
relative L2 +inf. Each is a :class:`~qinsight.plugin.Metric` with its direction
and its form over batch totals: adding a built-in metric is one entry in
:data:`qinsight.core.metrics.METRICS` (its direction and range) and one here (its computation).
Third-party metrics register under the entry-point group
``qinsight.metrics`` (entry name = metric name).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import torch

from qinsight.core import metrics as table
from qinsight.core.entry_points import installed, load_entry
from qinsight.core.errors import PluginLoadError
from qinsight.core.metrics import sqnr_of_sums
from qinsight.plugin.discovery import METRICS, find_entry
from qinsight.plugin.metric import ErrorTotals, Metric

TensorMetric = Callable[[torch.Tensor, torch.Tensor], float]
TotalsMetric = Callable[[ErrorTotals], float]
PositionMetric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _pair(reference: torch.Tensor, actual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if reference.shape != actual.shape:
        raise ValueError(f"cannot compare tensors of shapes {tuple(reference.shape)} and {tuple(actual.shape)}")
    return reference.detach().double().flatten(), actual.detach().double().flatten()


def sqnr(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 20 log10(||x|| / ||x - y||)."""
    x, y = _pair(reference, actual)
    signal, noise = float(x.norm()), float((x - y).norm())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 20.0 * math.log10(signal / noise)


def relative_l2(reference: torch.Tensor, actual: torch.Tensor) -> float:
    x, y = _pair(reference, actual)
    signal, noise = float(x.norm()), float((x - y).norm())
    if noise == 0.0:
        return 0.0
    return math.inf if signal == 0.0 else noise / signal


def cosine(reference: torch.Tensor, actual: torch.Tensor) -> float:
    x, y = _pair(reference, actual)
    nx, ny = float(x.norm()), float(y.norm())
    if nx == 0.0 or ny == 0.0:
        return 1.0 if nx == ny else 0.0
    return max(-1.0, min(1.0, float(x @ y) / (nx * ny)))  # rounding can step past ±1


def max_abs_error(reference: torch.Tensor, actual: torch.Tensor) -> float:
    x, y = _pair(reference, actual)
    return float((x - y).abs().max()) if x.numel() else 0.0


def mse(reference: torch.Tensor, actual: torch.Tensor) -> float:
    x, y = _pair(reference, actual)
    return float(((x - y) ** 2).mean()) if x.numel() else 0.0


def _sqnr_of(totals: ErrorTotals) -> float:
    return sqnr_of_sums(totals.ref_sq, totals.err_sq)


def _relative_l2_of(totals: ErrorTotals) -> float:
    if totals.err_sq == 0.0:
        return 0.0
    return math.inf if totals.ref_sq == 0.0 else math.sqrt(totals.err_sq / totals.ref_sq)


def _cosine_of(totals: ErrorTotals) -> float:
    # x·y needs no sum of its own: x·y = (|x|² + |y|² - |x - y|²) / 2
    if totals.ref_sq == 0.0 or totals.act_sq == 0.0:
        return 1.0 if totals.ref_sq == totals.act_sq else 0.0
    value = (totals.ref_sq + totals.act_sq - totals.err_sq) / (2 * math.sqrt(totals.ref_sq * totals.act_sq))
    return max(-1.0, min(1.0, value))


def _mse_of(totals: ErrorTotals) -> float:
    return totals.err_sq / totals.count if totals.count else 0.0


def top1(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """The share of rows (first dimension: samples) whose argmax agrees; 1 for no rows."""
    if reference.shape != actual.shape:
        raise ValueError(f"cannot compare tensors of shapes {tuple(reference.shape)} and {tuple(actual.shape)}")
    rows = reference.shape[0] if reference.dim() else 1
    if rows == 0 or reference.numel() == 0:
        return 1.0
    x, y = reference.detach().reshape(rows, -1), actual.detach().reshape(rows, -1)
    return float((x.argmax(dim=1) == y.argmax(dim=1)).double().mean())


def _positions(reference: torch.Tensor, actual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both tensors as (positions, vocabulary) float64 rows: the last dimension is the vocabulary."""
    if reference.shape != actual.shape:
        raise ValueError(f"cannot compare tensors of shapes {tuple(reference.shape)} and {tuple(actual.shape)}")
    vocabulary = reference.shape[-1] if reference.dim() else 1
    return reference.detach().double().reshape(-1, vocabulary), actual.detach().double().reshape(-1, vocabulary)


def kl_per_position(reference_log: torch.Tensor, actual_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) at each position (row), in nats, from the log-softmax rows of p and q: the one KL of
    :func:`kl`, a plan's damage and its confidence bound (a caller scoring many runs computes the
    reference's log-softmax once, in the precision it wants)."""
    return (reference_log.exp() * (reference_log - actual_log)).sum(dim=1)


def kl_positions(reference: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """KL(p || q) at each position, p and q the softmax of the reference's and the actual logits over
    the last dimension, in nats (float64): what :func:`kl` is the mean of."""
    x, y = _positions(reference, actual)
    return kl_per_position(torch.log_softmax(x, dim=1), torch.log_softmax(y, dim=1))


def kl(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """The mean over positions of KL(p || q) (:func:`kl_positions`): 0 for identical logits (or logits
    that differ by a constant)."""
    per_position = kl_positions(reference, actual)
    if per_position.numel() == 0:
        return 0.0
    return max(0.0, float(per_position.mean()))  # rounding can dip below 0 for identical logits


def agreement_positions(reference: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """1 at each position whose argmax over the last dimension (the next token) agrees, else 0 (float64):
    what :func:`token_agreement` is the mean of."""
    x, y = _positions(reference, actual)
    return (x.argmax(dim=1) == y.argmax(dim=1)).double()


def token_agreement(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """The share of positions whose argmax over the last dimension (the next token) agrees; 1 for none."""
    agreeing = agreement_positions(reference, actual)
    return float(agreeing.mean()) if agreeing.numel() else 1.0


_COMPUTED: Final[dict[str, tuple[TensorMetric, TotalsMetric | None]]] = {
    "sqnr": (sqnr, _sqnr_of),
    "relative_l2": (relative_l2, _relative_l2_of),
    "cosine": (cosine, _cosine_of),
    "max_abs_error": (max_abs_error, lambda t: t.max_abs),
    "mse": (mse, _mse_of),
    "top1": (top1, None),
    "kl": (kl, None),
    "token_agreement": (token_agreement, None),
}
# The metrics that are a mean over a language model's positions: what each is the mean of (a plan bounds them).
_PER_POSITION: Final[dict[str, PositionMetric]] = {"kl": kl_positions, "token_agreement": agreement_positions}
# Each metric of the one table (qinsight.core.metrics), computed: its direction and range come from there.
BUILTIN: Final[dict[str, Metric]] = {
    name: Metric(
        name=name,
        higher_is_better=spec.higher_is_better,
        on_tensors=_COMPUTED[name][0],
        from_totals=_COMPUTED[name][1],
        per_position=_PER_POSITION.get(name),
    )
    for name, spec in table.METRICS.items()
}
DEFAULT: Final = table.COMPARISON_DEFAULT


def _as_metric(loaded: object, name: str, source: str) -> Metric:
    """A plugin's entry-point object as a :class:`Metric`.

    A bare callable ``(reference, actual) -> float`` is accepted as an error
    metric (smaller is better), which is what every plugin metric was before
    metrics could say their direction.
    """
    if isinstance(loaded, Metric):
        if loaded.name != name:
            raise PluginLoadError(
                name, source, f"its name is {loaded.name!r}, but it is registered as {name!r}", kind="metric"
            )
        return loaded
    if callable(loaded):
        return Metric(name=name, higher_is_better=False, on_tensors=loaded)
    raise PluginLoadError(
        name, source, f"the entry point gives {type(loaded).__name__}, not a Metric or a callable", kind="metric"
    )


def load_metric(name: str) -> Metric:
    """A built-in metric, or a third party's from the ``qinsight.metrics`` entry points."""
    if name in BUILTIN:
        return BUILTIN[name]
    entry = find_entry(METRICS, name)
    if entry is None:
        known = sorted({*BUILTIN, *(e.name for e in installed(METRICS))})
        raise PluginLoadError(name, "this environment", f"no such metric (known: {', '.join(known)})", kind="metric")
    return _as_metric(load_entry(entry, kind="metric"), name, entry.source)


def load_metrics(names: Sequence[str] | None) -> dict[str, Metric]:
    return {name: load_metric(name) for name in (DEFAULT if names is None else names)}
