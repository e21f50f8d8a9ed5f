"""x86: FX's x86 engine, torchao's ``X86InductorQuantizer`` for PT2E, torchao ``quantize_``'s int8
kernels; its program is inductor's (``torch.compile`` with freezing, the quantized patterns fused
into oneDNN int8 kernels), its size the bytes of the tensors the module computes with.

``X86InductorQuantizer`` cannot mix static and dynamic configs: a module-level dynamic override under
a static global config is skipped with a warning and the module stays static (torchao 0.18). So the
advice's dynamic modules get a quantizer of their own (dynamic, those modules only), the static one
excludes them, and the two are composed. Modules kept in float are excluded from both (a call kept
float alone is stripped after annotation instead). A per-tensor weight suggestion gets a per-tensor
weight spec. Every override is checked in a converted graph by tests/apply/test_pt2e.py.
"""

from __future__ import annotations

from typing import Any

from qinsight.core.backend import PT2E_HINT, Backend, Program, Pt2eQuantizers
from qinsight.core.errors import MissingExtraError
from qinsight.core.sites import OpSite, WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion


def _torchao() -> Any:
    try:
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer
    except ImportError as exc:
        raise MissingExtraError(f"{PT2E_HINT} ({exc})") from exc
    return x86_inductor_quantizer


def quantizer_types() -> tuple[type, ...]:
    return (_torchao().X86InductorQuantizer,)


def default_x86_quantizer() -> Any:
    """torchao's ``X86InductorQuantizer`` with its default static config for every module."""
    x86 = _torchao()
    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())


def advice_quantizer(sites: tuple[OpSite, ...], suggestions: tuple[QuantSuggestion, ...]) -> Any:
    """An ``X86InductorQuantizer`` (grouped: :mod:`.grouped_x86`) applying ``suggestions`` about ``sites``."""
    x86 = _torchao()  # first: without torchao, the one error saying what to install
    from torchao.quantization.pt2e import observer
    from torchao.quantization.pt2e.quantizer import ComposableQuantizer

    from qinsight.apply.pt2e import floated_modules, honouring, per_tensor_weights
    from qinsight.backends.grouped_x86 import GroupedX86InductorQuantizer

    static_config = x86.get_default_x86_inductor_quantization_config()
    dynamic_config = x86.get_default_x86_inductor_quantization_config(is_dynamic=True)
    # one config object per kind of entry: the grouped quantizer annotates the modules of each in one pass
    per_tensor = {config: per_tensor_weights(config, observer) for config in (static_config, dynamic_config)}
    static = GroupedX86InductorQuantizer().set_global(static_config)
    dynamic = GroupedX86InductorQuantizer()
    dynamic_modules = []
    modules = {site.fqn: site.module for site in sites if site.kind.is_layer}
    floated = floated_modules(modules, suggestions)  # a call kept float alone is stripped instead
    for suggestion in (s for s in suggestions if s.fqn in modules):
        tensor_wise, module = suggestion.weight is WeightScheme.PER_TENSOR, modules[suggestion.fqn]
        if suggestion.keep_float:
            if module in floated:
                static.set_module_name_qconfig(module, None)
        elif suggestion.activation is ActivationMode.DYNAMIC:
            dynamic.set_module_name_qconfig(module, per_tensor[dynamic_config] if tensor_wise else dynamic_config)
            static.set_module_name_qconfig(module, None)
            dynamic_modules.append(module)
        elif tensor_wise:
            static.set_module_name_qconfig(module, per_tensor[static_config])
    inner = ComposableQuantizer([dynamic, static]) if dynamic_modules else static
    left_out = frozenset(fqn for fqn, module in modules.items() if module in floated)
    return honouring(inner, sites, suggestions, "X86InductorQuantizer", left_out=left_out)


class _CompiledProgram:
    def __init__(self, compiled: Any, size_bytes: int) -> None:
        self._compiled, self.size_bytes = compiled, size_bytes

    def __call__(self, *inputs: Any) -> Any:
        import torch
        from torch._inductor import config

        with torch.no_grad(), config.patch(freezing=True):
            return self._compiled(*inputs)


class InductorLowering:
    """``torch.compile`` with inductor and freezing, as torchao's X86InductorQuantizer is meant to be
    deployed; compiled at the first call, which :meth:`lower` makes."""

    backend = "x86"

    def runtime(self) -> str:
        import torch

        return f"torch {torch.__version__} torch.compile (inductor, freezing)"

    def lower(self, module: Any, example: tuple[Any, ...]) -> Program:
        import torch

        from qinsight.compare.programs import evaluated_copy, held_bytes, quiet

        copied = evaluated_copy(module)
        program = _CompiledProgram(torch.compile(copied, dynamic=False), held_bytes(copied))
        with quiet():
            program(*example)
        return program


X86 = Backend(
    name="x86",
    title="x86",
    fx_engine="x86",
    reduced_range=True,
    pt2e=Pt2eQuantizers(
        types=quantizer_types, default=default_x86_quantizer, default_name="x86 default", from_advice=advice_quantizer
    ),
    lowering=InductorLowering(),
    runs_quantize_=True,
)

__all__ = ["X86", "InductorLowering", "advice_quantizer", "default_x86_quantizer"]
