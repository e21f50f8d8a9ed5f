"""XNNPACK: ExecuTorch's ``XNNPACKQuantizer`` (PT2E, the ``executorch`` extra), its program lowered
through ExecuTorch's XNNPACK delegate and run by ``executorch.runtime``, its size the ``.pte``'s bytes.

One quantizer mixes static and dynamic modules itself: the global config is its symmetric static
per-channel one, a dynamic or per-tensor layer gets a module config of its own, and the layers kept
in float are stripped after annotation like the ops (its ``set_module_name`` refuses ``None``).
FX has no XNNPACK engine: where only FX's config can be read (which ops around the layers are
quantized), qnnpack's stands in.
"""

from __future__ import annotations

from typing import Any

from qinsight.core.backend import Backend, Program, Pt2eQuantizers
from qinsight.core.errors import FrontendError, MissingExtraError
from qinsight.core.sites import OpSite, WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion

XNNPACK_HINT = "XNNPACK's quantizer comes with ExecuTorch: pip install 'qinsight[executorch]'"
EXECUTORCH_HINT = "lowering to XNNPACK needs ExecuTorch: pip install 'qinsight[executorch]'"


def _xnnpack() -> Any:
    try:
        from executorch.backends.xnnpack.quantizer import xnnpack_quantizer
    except ImportError as exc:
        raise MissingExtraError(f"{XNNPACK_HINT} ({exc})") from exc
    return xnnpack_quantizer


def quantizer_types() -> tuple[type, ...]:
    return (_xnnpack().XNNPACKQuantizer,)


def default_xnnpack_quantizer() -> Any:
    """ExecuTorch's ``XNNPACKQuantizer`` with its symmetric per-channel static config for every module,
    the PT2E documentation's own example."""
    xnnpack = _xnnpack()
    return xnnpack.XNNPACKQuantizer().set_global(xnnpack.get_symmetric_quantization_config(is_per_channel=True))


def advice_quantizer(
    sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...], quantizer_class: type | None = None
) -> Any:
    """An ``XNNPACKQuantizer`` (or ``quantizer_class``, a subclass: a backend of its own built on it)
    applying ``suggestions``: symmetric static per-channel by default, a module config of its own for
    each dynamic or per-tensor layer, the sites kept in float stripped after it annotates."""
    from qinsight.apply.pt2e import honouring

    xnnpack = _xnnpack()
    configs = {
        (channels, dynamic): xnnpack.get_symmetric_quantization_config(is_per_channel=channels, is_dynamic=dynamic)
        for channels in (True, False)
        for dynamic in (False, True)
    }
    quantizer = quantizer_class or xnnpack.XNNPACKQuantizer
    inner = quantizer().set_global(configs[True, False])
    modules = {site.fqn: site.module for site in sites if site.kind.is_layer}
    for suggestion in (s for s in suggestions if s.fqn in modules and not s.keep_float):
        wanted = (suggestion.weight is not WeightScheme.PER_TENSOR, suggestion.activation is ActivationMode.DYNAMIC)
        if wanted != (True, False):
            inner.set_module_name(modules[suggestion.fqn], configs[wanted])
    return honouring(inner, sites, suggestions, quantizer.__name__)


class _ExecuTorchProgram:
    def __init__(self, buffer: bytes) -> None:
        from executorch.runtime import Runtime

        self._buffer = buffer  # the loaded program reads from it
        self._method = Runtime.get().load_program(buffer).load_method("forward")
        self.size_bytes = len(buffer)

    def __call__(self, *inputs: Any) -> Any:
        try:
            outputs = self._method.execute([tensor.contiguous() for tensor in inputs])
        except RuntimeError as exc:  # the runtime logged why to stderr; its exception says only a code
            raise FrontendError(f"the ExecuTorch runtime failed to run the program: {exc}") from exc
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class XnnpackLowering:
    """XNNPACK through ExecuTorch: every pattern the partitioner takes runs in the delegate, the rest
    in ExecuTorch's portable kernels."""

    def __init__(self, backend: str = "xnnpack") -> None:
        self.backend = backend  # a backend built on XNNPACK's (a renamed quantizer) lowers alike

    def runtime(self) -> str:
        from qinsight.compare.programs import package_version

        return f"ExecuTorch {package_version('executorch')} runtime, XNNPACK delegate"

    def lower(self, module: Any, example: tuple[Any, ...]) -> Program:
        import torch

        from qinsight.compare.programs import evaluated_copy, quiet

        try:
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
            from executorch.exir import to_edge_transform_and_lower
        except ImportError as exc:
            raise MissingExtraError(f"{EXECUTORCH_HINT} ({exc})") from exc
        with quiet():
            exported = torch.export.export(evaluated_copy(module), example)
            edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
            return _ExecuTorchProgram(edge.to_executorch().buffer)


XNNPACK = Backend(
    name="xnnpack",
    title="XNNPACK",
    fx_stand_in="qnnpack",
    pt2e=Pt2eQuantizers(
        types=quantizer_types,
        default=default_xnnpack_quantizer,
        default_name="XNNPACKQuantizer, symmetric per-channel",
        from_advice=advice_quantizer,
    ),
    lowering=XnnpackLowering(),
)

__all__ = [
    "EXECUTORCH_HINT",
    "XNNPACK",
    "XNNPACK_HINT",
    "XnnpackLowering",
    "advice_quantizer",
    "default_xnnpack_quantizer",
]
