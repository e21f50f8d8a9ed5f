"""SmoothQuant factors chosen by measurement (:class:`~qinsight.core.smoothing.SmoothingMapping`).

Every migration strength ``alpha`` in :data:`ALPHAS` is tried on each Linear
with the calibration data: the input divided by the factors and quantized per
tensor with the flow's activation bits (from each batch's range, as a dynamic
Linear does), the weight multiplied by them and quantized per output channel to
8 bits, and the Linear's output compared with the float one. The model gets
the ``alpha`` with the highest output SQNR summed over its Linears, and a
Linear is smoothed where that ``alpha`` beats leaving it as it is; no threshold
decides, only the measured error.

Two things keep the choice from fitting the calibration data rather than the
model (MiniLM, FX, every Linear dynamic and the rest float, cosine on held-out
sentences):

- The errors are cross-validated in two folds: factors fitted on the even
  calibration batches are judged on the odd ones and the other way round
  (with one batch, on itself). Judged on the batches they were fitted on,
  ``alpha`` near 1 wins, dividing each channel by its own calibration
  maximum, and new data then overflows the quiet channels: 0.9935.
- One ``alpha`` for the model: chosen per Linear, each choice picks up its
  own batches' noise: 0.9952; one ``alpha`` (0.7 there) for all: 0.9959.

The factors of the chosen ``alpha`` are then taken from every batch's range.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from qinsight.core.metrics import sqnr_of_sums
from qinsight.core.smoothing import SmoothingEntry, SmoothingMapping
from qinsight.frontends import eval_mode, run_batch
from qinsight.planning.switches import dynamic_fake_quantize, fake_quantized_weight

ALPHAS = tuple(step / 10 for step in range(11))
_TINY = 1e-5


def choose_smoothing(
    model: nn.Module, calibration: Sequence[object], linears: Sequence[str], activation_bits: int
) -> SmoothingMapping:
    """The factors of the ``alpha`` that minimises the Linears' output error under the flow's
    quantization, for each Linear of ``linears`` (module names; others are skipped) they improve."""
    modules = dict(model.named_modules())
    chosen = {name: modules[name] for name in linears if type(modules.get(name)) is nn.Linear}
    halves = [list(calibration[0::2]), list(calibration[1::2]) or list(calibration)]
    ranges = [_input_ranges(model, chosen, half) for half in halves]
    names = [name for name in ranges[0] if name in ranges[1]]  # forward order: the order the Linears first ran
    errors = {name: _Error() for name in names}
    weights = {name: chosen[name].weight.detach().float() for name in names}
    for fitted, judged in ((ranges[0], halves[1]), (ranges[1], halves[0])):  # fit on one half, judge on the other
        candidates = {name: _candidate_factors(fitted[name], weights[name]) for name in names}

        def measure(name: str, x: torch.Tensor) -> None:
            if name in errors:
                errors[name].add(x, weights[name], candidates[name], 2**activation_bits - 1)

        _run(model, chosen, judged, measure)
    sqnr = {name: errors[name].sqnr() for name in names}
    comparable = [name for name in names if all(math.isfinite(v) for v in sqnr[name])]
    if not comparable:
        return SmoothingMapping()
    best = max(range(1, len(ALPHAS) + 1), key=lambda i: sum(sqnr[name][i] for name in comparable))
    entries = []
    for name in (name for name in names if sqnr[name][best] > sqnr[name][0]):
        factors = _candidate_factors(torch.maximum(ranges[0][name], ranges[1][name]), weights[name])[best]
        entries.append(
            SmoothingEntry(
                fqn=name,
                alpha=ALPHAS[best - 1],
                factors=tuple(factors.tolist()),
                sqnr_before=sqnr[name][0],
                sqnr_after=sqnr[name][best],
            )
        )
    return SmoothingMapping(entries=tuple(entries))


class _Error:
    """A Linear's output error summed over batches, with no smoothing and with each candidate's factors."""

    def __init__(self) -> None:
        self.energy, self.noise = 0.0, [0.0] * (len(ALPHAS) + 1)

    def add(self, x: torch.Tensor, weight: torch.Tensor, candidates: list[torch.Tensor], top: int) -> None:
        reference = x @ weight.T
        self.energy += float(reference.square().sum())
        for i, factors in enumerate(candidates):
            out = dynamic_fake_quantize(x / factors, top) @ fake_quantized_weight(weight * factors, per_channel=True).T
            self.noise[i] += float((out - reference).square().sum())

    def sqnr(self) -> list[float]:
        return [sqnr_of_sums(self.energy, noise) for noise in self.noise]


def _input_ranges(
    model: nn.Module, linears: dict[str, nn.Module], batches: Sequence[object]
) -> dict[str, torch.Tensor]:
    """Each Linear's largest absolute input per channel over ``batches``, in the order they ran."""
    found: dict[str, torch.Tensor] = {}
    _run(model, linears, batches, lambda name, x: _widen(found, name, x))
    return found


def _widen(ranges: dict[str, torch.Tensor], name: str, x: torch.Tensor) -> None:
    widest = x.abs().amax(0)
    ranges[name] = torch.maximum(ranges[name], widest) if name in ranges else widest


def _candidate_factors(absmax: torch.Tensor, weight: torch.Tensor) -> list[torch.Tensor]:
    """No smoothing (ones), then SmoothQuant's factors for each alpha of :data:`ALPHAS`."""
    inputs, columns = absmax.double().clamp(min=_TINY), weight.abs().amax(0).double().clamp(min=_TINY)
    found = [torch.ones_like(inputs)]
    found += [(inputs**alpha / columns ** (1.0 - alpha)).clamp(min=_TINY) for alpha in ALPHAS]
    return [f.float() for f in found]


def _run(
    model: nn.Module, linears: dict[str, nn.Module], batches: Sequence[object], see: Callable[[str, torch.Tensor], None]
) -> None:
    """The calibration data through ``model``, ``see`` given each Linear's input as (rows, channels)."""
    with _pre_hooks(linears, see), eval_mode(model), torch.no_grad():
        for batch in batches:
            run_batch(model, batch)


@contextlib.contextmanager
def _pre_hooks(linears: dict[str, nn.Module], see: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    def hook(name: str) -> Callable[[nn.Module, tuple[object, ...]], None]:
        def pre(_module: nn.Module, args: tuple[object, ...]) -> None:
            x = args[0]
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                see(name, x.detach().flatten(0, -2).float())

        return pre

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in linears.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["ALPHAS", "choose_smoothing"]
