"""``edge``: a backend qinsight does not ship, as one record (see README.md)."""

from __future__ import annotations

import functools
from typing import Any

from qinsight.plugin import Backend, OpSite, Program, Pt2eQuantizers, QuantSuggestion


@functools.cache
def edge_quantizer_class() -> type:
    """``EdgeQuantizer``: ExecuTorch's XNNPACKQuantizer under a name of its own (built on first use:
    importing this module imports no ExecuTorch)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    return type("EdgeQuantizer", (XNNPACKQuantizer,), {"__module__": __name__})


def default_quantizer() -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    return edge_quantizer_class()().set_global(get_symmetric_quantization_config(is_per_channel=True))


def advice_quantizer(sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...]) -> Any:
    """The report's advice as an EdgeQuantizer: XNNPACK's way of applying it, with this class."""
    from qinsight.backends.xnnpack import advice_quantizer as xnnpack_way

    return xnnpack_way(sites, suggestions, quantizer_class=edge_quantizer_class())


class _Program:
    def __init__(self, buffer: bytes) -> None:
        from executorch.runtime import Runtime

        self._buffer = buffer
        self._method = Runtime.get().load_program(buffer).load_method("forward")
        self.size_bytes = len(buffer)

    def __call__(self, *inputs: Any) -> Any:
        outputs = self._method.execute([tensor.contiguous() for tensor in inputs])
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class EdgeLowering:
    """torch.export, then ExecuTorch with the partitioner of the target (XNNPACK's stands in here)."""

    backend = "edge"

    def runtime(self) -> str:
        from importlib.metadata import version

        return f"ExecuTorch {version('executorch')} runtime, edge target"

    def lower(self, module: Any, example: tuple[Any, ...]) -> Program:
        import copy

        import torch
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        exported = torch.export.export(copy.deepcopy(module), example)
        edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
        return _Program(edge.to_executorch().buffer)


EDGE = Backend(
    name="edge",
    title="Edge (ExecuTorch)",
    pt2e=Pt2eQuantizers(
        types=lambda: (edge_quantizer_class(),),
        default=default_quantizer,
        default_name="EdgeQuantizer, symmetric per-channel",
        from_advice=advice_quantizer,
    ),
    lowering=EdgeLowering(),
)

__all__ = ["EDGE", "EdgeLowering", "advice_quantizer", "default_quantizer", "edge_quantizer_class"]
