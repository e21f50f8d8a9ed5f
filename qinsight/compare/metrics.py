"""Error metrics between a reference (float) tensor and an actual (quantized) one.

Each built-in has defined values where torch's ``compute_sqnr`` gives nan or
divides by zero: identical tensors are a perfect match (SQNR +inf, relative
L2 0, cosine 1), and a zero reference with any error has SQNR -inf and
relative L2 +inf. Each is a :class:`~qinsight.plugin.Metric` with its direction
and its form over batch totals: adding a built-in metric is one entry in
:data:`BUILTIN`. Third-party metrics register under the entry-point group
``qinsight.metrics`` (entry name = metric name).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import torch

from qinsight.core.errors import PluginLoadError
from qinsight.plugin.discovery import METRICS, find_entry, installed, load_entry
from qinsight.plugin.metric import ErrorTotals, Metric


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
    return float(x @ y) / (nx * ny)


def max_abs_error(reference: torch.Tensor, actual: torch.Tensor) -> float:
    x, y = _pair(reference, actual)
    return float((x - y).abs().max()) if x.numel() else 0.0


def mse(reference: torch.Tensor, actual: torch.Tensor) -> float:
    x, y = _pair(reference, actual)
    return float(((x - y) ** 2).mean()) if x.numel() else 0.0


def sqnr_of_sums(ref_sq: float, err_sq: float) -> float:
    """SQNR in dB from the sums of x² and of (x - y)²: inf without error, -inf without signal."""
    if err_sq == 0.0:
        return math.inf
    return -math.inf if ref_sq == 0.0 else 10 * math.log10(ref_sq / err_sq)


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
    return (totals.ref_sq + totals.act_sq - totals.err_sq) / (2 * math.sqrt(totals.ref_sq * totals.act_sq))


def _mse_of(totals: ErrorTotals) -> float:
    return totals.err_sq / totals.count if totals.count else 0.0


BUILTIN: Final[dict[str, Metric]] = {
    metric.name: metric
    for metric in (
        Metric(name="sqnr", higher_is_better=True, on_tensors=sqnr, from_totals=_sqnr_of),
        Metric(name="relative_l2", higher_is_better=False, on_tensors=relative_l2, from_totals=_relative_l2_of),
        Metric(name="cosine", higher_is_better=True, on_tensors=cosine, from_totals=_cosine_of),
        Metric(name="max_abs_error", higher_is_better=False, on_tensors=max_abs_error, from_totals=lambda t: t.max_abs),
        Metric(name="mse", higher_is_better=False, on_tensors=mse, from_totals=_mse_of),
    )
}
DEFAULT: Final = tuple(BUILTIN)


def _as_metric(loaded: object, name: str, source: str) -> Metric:
    """A plugin's entry-point object as a :class:`Metric`.

    A bare callable ``(reference, actual) -> float`` is accepted as an error
    metric (smaller is better), which is what every plugin metric was before
    metrics could say their direction.
    """
    if isinstance(loaded, Metric):
        if loaded.name != name:
            raise PluginLoadError(name, source, f"its name is {loaded.name!r}, but it is registered as {name!r}", kind="metric")
        return loaded
    if callable(loaded):
        return Metric(name=name, higher_is_better=False, on_tensors=loaded)
    raise PluginLoadError(name, source, f"the entry point gives {type(loaded).__name__}, not a Metric or a callable", kind="metric")


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
