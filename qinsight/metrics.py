"""Error metrics between a reference (float) tensor and an actual (quantized) one.

A metric is a callable ``(reference, actual) -> float`` with a ``name``. Each
built-in has defined values where torch's ``compute_sqnr`` gives nan or
divides by zero: identical tensors are a perfect match (SQNR +inf, relative
L2 0, cosine 1), and a zero reference with any error has SQNR -inf and
relative L2 +inf. Third-party metrics register under the entry-point group
``qinsight.metrics`` (entry name = metric name).
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Callable, Sequence
from typing import Final

import torch

from qinsight.errors import PluginLoadError

MetricFn = Callable[[torch.Tensor, torch.Tensor], float]
GROUP: Final = "qinsight.metrics"


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


BUILTIN: Final[dict[str, MetricFn]] = {
    "sqnr": sqnr,
    "relative_l2": relative_l2,
    "cosine": cosine,
    "max_abs_error": max_abs_error,
    "mse": mse,
}
DEFAULT: Final = ("sqnr", "relative_l2", "cosine", "max_abs_error", "mse")


def load_metric(name: str) -> MetricFn:
    """A built-in metric, or a third party's from the ``qinsight.metrics`` entry points."""
    if name in BUILTIN:
        return BUILTIN[name]
    for entry in importlib.metadata.entry_points(group=GROUP):
        if entry.name == name:
            try:
                metric = entry.load()
            except Exception as exc:
                raise PluginLoadError(name, entry.value, f"{type(exc).__name__}: {exc}") from exc
            if not callable(metric):
                raise PluginLoadError(name, entry.value, "the entry point is not callable")
            return metric  # type: ignore[no-any-return]
    known = sorted({*BUILTIN, *(e.name for e in importlib.metadata.entry_points(group=GROUP))})
    raise PluginLoadError(name, "this environment", f"no such metric (known: {', '.join(known)})")


def load_metrics(names: Sequence[str] | None) -> dict[str, MetricFn]:
    return {name: load_metric(name) for name in (DEFAULT if names is None else names)}
