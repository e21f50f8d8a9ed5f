"""Several candidate quantization configs of one model, compared layer by layer (torch's n-shadows job).

Each candidate is a config of one of the flows (:mod:`qinsight.apply.torch_flows`): a torch ``QConfigMapping`` (FX)
or a torchao PT2E ``Quantizer``, composed or not (PT2E). All candidates calibrate in one pass over
the calibration data, then one pass over the evaluation data measures every
layer under every candidate (:func:`qinsight.compare.activations.measure_activations`):
the float model runs once per batch. The result is one typed table, with the
config that makes the least local error per layer.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from qinsight.apply.torch_flows import prepare_config
from qinsight.compare.activations import measure_activations
from qinsight.compare.metric_functions import DEFAULT
from qinsight.core.comparison import (
    ConfigComparison,
    ConfigScore,
    LayerConfigRow,
    best_config,
)
from qinsight.core.errors import FrontendError, InvalidParameterError, QinsightError
from qinsight.distributed import current_shard
from qinsight.frontends import batch_arguments, eval_mode, model_structure, run_batch


def _example_inputs(batch: object) -> tuple[Any, ...]:
    args, kwargs = batch_arguments(batch)
    if kwargs:
        raise InvalidParameterError(
            "compare_configs", "example_inputs", None, "example inputs as a tuple for keyword-argument batches"
        )
    return args


def quantize_candidates(
    model: nn.Module,
    configs: Mapping[str, object],
    calibration: Iterable[object],
    *,
    example_inputs: tuple[Any, ...] | None = None,
) -> dict[str, nn.Module]:
    """``model`` quantized under each config, all calibrated in one pass over ``calibration``."""
    batches = iter(calibration)
    first = next(batches, None)
    if first is None:
        raise InvalidParameterError("compare_configs", "calibration", "no batches", "at least one batch")
    example = example_inputs if example_inputs is not None else _example_inputs(first)
    prepared = {}
    for name, config in configs.items():
        with _candidate(name, model, "prepare"):
            prepared[name] = prepare_config(model, config, example)
    with torch.no_grad(), contextlib.ExitStack() as stack:
        for module, _flow in prepared.values():
            stack.enter_context(eval_mode(module))
        for batch in itertools.chain([first], batches):
            for name, (module, _flow) in prepared.items():
                with _candidate(name, model, "calibrate"):
                    run_batch(module, batch)
    converted = {}
    for name, (module, flow) in prepared.items():
        with _candidate(name, model, "convert"):
            converted[name] = flow.convert(module)
    return converted


@contextlib.contextmanager
def _candidate(name: str, model: nn.Module, step: str) -> Iterator[None]:
    """A config the flow cannot take (an export that fails, a quantizer whose observers break the model)
    as one :class:`FrontendError` naming the config and the step, not the flow's traceback."""
    try:
        yield
    except QinsightError:
        raise
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise FrontendError(
            f"config {name!r} cannot {step} {type(model).__name__}: {type(exc).__name__}: {first}; leave it out "
            "of the comparison"
        ) from exc


def compare_configs(
    float_model: nn.Module,
    configs: Mapping[str, object],
    calibration: Iterable[object],
    data: Iterable[object] | None = None,
    *,
    example_inputs: tuple[Any, ...] | None = None,
    metrics: Sequence[str] | None = None,
    rank_by: str = "sqnr",
    distributed: bool = False,
) -> ConfigComparison:
    """Every Linear/Conv of ``float_model`` under each of ``configs``, and the best config per layer.

    Args:
        float_model: the model as it was before quantization.
        configs: a name for each ``QConfigMapping`` or torchao ``Quantizer`` to compare.
        calibration: the batches every config calibrates on.
        data: the batches errors are measured on (default: the calibration batches again, which must then
            be a sequence, not a one-shot iterator).
        example_inputs: the inputs prepare traces with (default: the first calibration batch).
        metrics: names of built-in or plugin metrics (default: all built-ins).
        rank_by: the local metric that picks each layer's best config (SQNR: the highest).
        distributed: every rank calibrates on all of ``calibration`` (torch's histogram observers do not
            merge, so the candidates must be calibrated alike) and measures its own ``data`` batches
            (default: its stride of the calibration batches); every rank gets the comparison of all
            ranks' batches.

    Returns:
        The :class:`ConfigComparison`: each layer's row per config and the config that serves it best.
    """
    if not configs:
        raise InvalidParameterError("compare_configs", "configs", {}, "at least one config")
    names = tuple(DEFAULT if metrics is None else metrics)
    if rank_by not in names:
        raise InvalidParameterError(
            "compare_configs", "rank_by", rank_by, f"one of the measured metrics: {', '.join(names)}"
        )
    if data is None:
        if iter(calibration) is calibration:
            raise InvalidParameterError(
                "compare_configs",
                "data",
                None,
                "evaluation batches, or calibration as a sequence (an iterator is used up)",
            )
        data = calibration
        if distributed:
            data = list(current_shard("compare_configs").of(calibration))
    quantized = quantize_candidates(float_model, configs, calibration, example_inputs=example_inputs)
    structure = model_structure(float_model)
    measured = measure_activations(
        float_model, quantized, data, metrics=names, structure=structure, distributed=distributed, ops=False
    )
    by_layer = {name: {layer.fqn: layer for layer in comparison.layers} for name, comparison in measured.items()}
    rows = []
    for fqn, found in structure.modules.items():
        scores = tuple(
            ConfigScore(
                config=name,
                quantized_type=layers[fqn].quantized_type,
                propagated=layers[fqn].propagated,
                local=layers[fqn].local,
            )
            for name, layers in by_layer.items()
            if fqn in layers and layers[fqn].quantized and layers[fqn].batches
        )
        if scores:
            rows.append(
                LayerConfigRow(fqn=fqn, kind=found.kind.value, scores=scores, best=best_config(scores, rank_by))
            )
    return ConfigComparison(configs=tuple(configs), rank_by=rank_by, rows=tuple(rows))


__all__ = ["compare_configs", "quantize_candidates"]
