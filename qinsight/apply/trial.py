"""One config quantized for real and run, as a measurement: what the report's verification and the plans share.

:func:`run_trial` follows ``qinsight.quantize``'s recipe (:func:`~qinsight.apply.recipe.quantize_with`:
smooth, prepare, calibrate, convert), runs the model as the user ships it (the converted reference, or
the program a backend lowers it to) on the batches to score, and reads from the converted model which
layers it really quantizes. A config the flow cannot build or run is a result, not a crash: the
:class:`Trial` carries the flow's error, said in one line.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import torch
from torch import nn

from qinsight.apply.recipe import quantize_with
from qinsight.apply.torch_flows import release_fx_graphs
from qinsight.compare.layers import quantized_layers
from qinsight.compare.programs import LoweredModule, shipped
from qinsight.core.advice import Advice
from qinsight.core.backend import Lowering
from qinsight.core.comparison import ProgramCost
from qinsight.core.errors import describe
from qinsight.core.sites import OpSite
from qinsight.frontends import classify, eval_mode, run_batch


@attrs.frozen(eq=False)
class Trial:
    """A config quantized for real: the shipped model's ``outputs`` on each batch it ran, the layers of
    the float model the converted one ``quantized``, and where it was lowered, its ``program``'s time
    and size; or the ``failure`` of the flow to build or run it."""

    outputs: tuple[Any, ...] = ()
    quantized: frozenset[str] = frozenset()
    failure: Exception | None = None
    program: ProgramCost | None = None

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @property
    def error(self) -> str:
        """The failure in one line (``""``: none), as verification's reasons and plans' notes say it."""
        if self.failure is None:
            return ""
        return describe(self.failure).splitlines()[0] if str(self.failure) else type(self.failure).__name__

    def left_float(self, meant: Iterable[str]) -> tuple[str, ...]:
        """The layers of ``meant`` (those the config quantizes) that the converted model left in float."""
        return tuple(fqn for fqn in meant if fqn not in self.quantized)


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """A config quantized and run as a measurement: its warnings (the advice's own, said with the report)
    ignored, and the traceback an FX graph prints to stderr before it raises kept off the terminal: a
    failure there is a result (the config cannot run), which the caller says."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def run_trial(
    model: nn.Module,
    advice: Advice,
    calibration: Sequence[object],
    scored: Sequence[object],
    *,
    quantizer: object | None = None,
    lowering: Lowering | None = None,
    shaped_for: Sequence[object] = (),
) -> Trial:
    """``advice``'s config (on top of the user's ``quantizer``, where given) quantized for real through
    its flow on ``calibration``, shipped (lowered for ``lowering``'s backend, where given) and run on
    ``scored``; an exported model takes the input shapes of ``shaped_for`` too. Any error of the flow,
    at prepare, convert or the run, ends in a failed :class:`Trial`."""
    try:
        with measuring():
            converted = quantize_with(model, advice, calibration, quantizer, runs_on=[*scored, *shaped_for])
            ships = shipped(converted, lowering)
            outputs = tuple(model_outputs(ships, scored))
    except Exception as exc:  # torch's errors have no common base: prepare, convert and the run alike
        return Trial(failure=exc)
    finally:
        release_fx_graphs()  # verification and plans quantize for real many times
    layers = quantized_layers(model, converted)
    program = ships.cost() if isinstance(ships, LoweredModule) else None
    return Trial(outputs, frozenset(fqn for fqn, layer in layers.items() if layer.quantized), program=program)


def model_outputs(model: nn.Module, batches: Iterable[object]) -> list[Any]:
    """``model`` run on each batch, in eval mode, without gradients."""
    with eval_mode(model), torch.no_grad():
        return [run_batch(model, batch) for batch in batches]


def weight_counts(model: nn.Module, fqns: Iterable[str]) -> dict[str, int]:
    """The weight count of each of ``fqns`` in ``model`` (0: no module of that name, or no weight)."""
    modules = dict(model.named_modules())
    counts = {}
    for fqn in fqns:
        module = modules.get(fqn)
        found = classify(module) if module is not None else None
        weight = getattr(found[1] if found else module, "weight", None)
        counts[fqn] = int(weight.numel()) if isinstance(weight, torch.Tensor) else 0
    return counts


def weighted_layers(model: nn.Module, sites: Iterable[OpSite]) -> dict[str, int]:
    """The Linear/Conv sites of ``model`` that hold a weight, with its count: what a config quantizes."""
    counts = weight_counts(model, [site.fqn for site in sites if site.kind.is_layer])
    return {fqn: count for fqn, count in counts.items() if count > 0}


__all__ = ["Trial", "measuring", "model_outputs", "run_trial", "weight_counts", "weighted_layers"]
