"""What the lowered program computes, against the reference model it was lowered from, and what it costs.

:func:`compare_lowered` runs the float model, the ``convert_pt2e`` reference and
the program lowered from it (:mod:`qinsight.backends`) on the same batches:

- at the output: lowered vs reference, lowered vs float, reference vs float;
- per layer (:mod:`.parity`): each quantized layer lowered alone against the
  reference's same stretch of graph (local), and each layer's output with every
  kernel lowered (propagated);
- cost: the median wall time per batch of the int8 program and of the float
  model lowered the same way, and both programs' sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx, nn

from qinsight.compare.metric_functions import DEFAULT, load_metrics
from qinsight.compare.outputs import output_rows
from qinsight.compare.parity import layer_parities
from qinsight.compare.programs import LoweredModule
from qinsight.core.backend import backend_lowering
from qinsight.core.comparison import LayerParity, LoweredComparison, MetricValue, ProgramCost
from qinsight.core.errors import InvalidParameterError, QinsightError
from qinsight.frontends import eval_mode, example_inputs, exported_sites, misfit_input
from qinsight.plugin.metric import Metric

OWNER = "compare_lowered"


def _batches(data: Iterable[object]) -> list[tuple[Any, ...]]:
    """The batches' positional inputs, all of one shape (a program is lowered for the first's)."""
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise InvalidParameterError(OWNER, "data", type(data).__name__, "an iterable of batches")
    batches = [example_inputs(batch) for batch in data]
    if not batches:
        raise InvalidParameterError(OWNER, "data", "no batches", "at least one batch")

    def shapes(inputs: tuple[Any, ...]) -> list[object]:
        return [tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__ for value in inputs]

    first = shapes(batches[0])
    for index, inputs in enumerate(batches[1:], start=1):
        if shapes(inputs) != first:
            raise InvalidParameterError(
                OWNER,
                "data",
                f"batch {index} shaped {shapes(inputs)}",
                f"batches of one shape, {first} like the first: a program is lowered for one shape",
            )
    return batches


def _checked_reference(quantized: nn.Module) -> fx.GraphModule:
    if not isinstance(quantized, fx.GraphModule) or not exported_sites(quantized):
        raise InvalidParameterError(
            OWNER,
            "quantized",
            type(quantized).__name__,
            "a model converted by convert_pt2e (the reference a backend lowers); "
            "FX and quantize_ models are not lowered",
        )
    return quantized


def _check_fits(reference: fx.GraphModule, inputs: tuple[Any, ...]) -> None:
    """The batches fit the shapes the reference was exported for; else one error saying how to get a
    model for them (torch's guard would fail inside the lowering with a traceback)."""
    misfit = misfit_input(reference, inputs)
    if misfit:
        raise InvalidParameterError(
            OWNER,
            "data",
            misfit,
            "batches of the shape the quantized model was exported for: qinsight.quantize keeps the batch "
            "dimension dynamic where the model allows it, except from calibration batches of 1 (torch fixes a "
            "size-1 dimension): quantize on batches of 2 or more to run any batch size",
        )


def _metric_values(
    reference: torch.Tensor, actual: torch.Tensor, metrics: dict[str, Metric]
) -> tuple[MetricValue, ...]:
    return tuple(
        MetricValue(name=name, value=metric(reference, actual), higher_is_better=metric.higher_is_better)
        for name, metric in metrics.items()
    )


def _cost(program: LoweredModule, batches: Sequence[tuple[Any, ...]]) -> tuple[torch.Tensor, ProgramCost]:
    """The program's outputs on every batch, as rows, and its cost as a plan times it (the median time
    per batch after a first call that is not timed: :meth:`LoweredModule.cost`)."""
    rows = torch.cat([output_rows(program(*inputs), owner=OWNER) for inputs in batches])
    cost = program.cost()
    if cost is None:  # _batches admits no empty data: qinsight's own mistake
        raise QinsightError("compare_lowered timed a program it never ran")
    return rows, cost


def compare_lowered(
    float_model: nn.Module,
    quantized: nn.Module,
    data: Iterable[object],
    *,
    backend: str = "xnnpack",
    metrics: Sequence[str] | None = None,
    layers: bool = True,
    layer_batches: int = 2,
    float_program: bool = True,
) -> LoweredComparison:
    """``quantized`` (a ``convert_pt2e`` model) lowered for ``backend`` and run on ``data``, against the
    reference itself and against ``float_model``.

    Args:
        float_model: the model before quantization.
        quantized: the reference model ``convert_pt2e`` returned (quantized with the backend's quantizer:
            ``XNNPACKQuantizer`` for ``"xnnpack"``, ``X86InductorQuantizer`` for ``"x86"``).
        data: batches not used for calibration, all of one shape (positional tensors).
        backend: ``"xnnpack"`` (ExecuTorch, the ``qinsight[executorch]`` extra) or ``"x86"`` (inductor).
        metrics: the output metrics (default: the comparisons' own).
        layers: lower each quantized layer alone and measure it against its reference stretch on the
            first ``layer_batches`` batches (one lowering per layer: the costly part).
        float_program: lower ``float_model`` too, for the latency and size the int8 program is judged by.

    Returns:
        A :class:`~qinsight.core.comparison.LoweredComparison`.
    """
    lowering = backend_lowering(OWNER, backend)
    reference = _checked_reference(quantized)
    if layer_batches < 1:
        raise InvalidParameterError(OWNER, "layer_batches", layer_batches, "at least 1")
    batches = _batches(data)
    _check_fits(reference, batches[0])
    measured = load_metrics(tuple(DEFAULT if metrics is None else metrics))  # an unknown name fails before any lowering
    parities: tuple[LayerParity, ...] = ()
    skipped: tuple[str, ...] = ()
    if layers:
        parities, skipped = layer_parities(float_model, reference, batches[:layer_batches], lowering)
    program = LoweredModule(lowering, reference)  # each lowered at its first batch
    float_lowered = LoweredModule(lowering, float_model, "the float model") if float_program else None
    with torch.no_grad(), eval_mode(float_model), eval_mode(reference):
        floats = torch.cat([output_rows(float_model(*inputs), owner=OWNER) for inputs in batches])
        references = torch.cat([output_rows(reference(*inputs), owner=OWNER) for inputs in batches])
        runs, cost = _cost(program, batches)
        float_cost = _cost(float_lowered, batches)[1] if float_lowered is not None else None
    return LoweredComparison(
        backend=backend,
        runtime=lowering.runtime(),
        batches=len(batches),
        lowered_vs_reference=_metric_values(references, runs, measured),
        lowered_vs_float=_metric_values(floats, runs, measured),
        reference_vs_float=_metric_values(floats, references, measured),
        layers=parities,
        unlowered=skipped,
        program=cost,
        float_program=float_cost,
    )


__all__ = ["compare_lowered"]
