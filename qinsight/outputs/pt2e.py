"""From a Report to a torchao PT2E quantizer (``prepare_pt2e`` / ``convert_pt2e``).

``X86InductorQuantizer`` cannot mix static and dynamic configs: a module-level
dynamic override under a static global config is skipped with a warning and
the module stays static (torchao 0.18). So the report's dynamic modules get a quantizer of their own
(dynamic, those modules only), the static one excludes them, and the two are
composed. Modules kept in float are excluded from both. A per-tensor weight
suggestion gets a per-tensor weight spec. Every override is checked in a
converted graph by tests/test_pt2e.py.

PT2E has no input-weight equalization. Modules the report would equalize are
named in a warning (and in the text report) rather than dropped silently.
torchao is an optional extra: without it, this module raises one error saying
what to install.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

import torch

from qinsight.core.errors import MissingExtraError
from qinsight.core.sites import WeightScheme
from qinsight.core.suggestions import ActivationMode

if TYPE_CHECKING:
    from qinsight.core.report import Report

INSTALL_HINT = "PT2E quantization needs torchao: pip install 'qinsight[pt2e]'"


def _torchao() -> Any:
    try:
        from torchao.quantization.pt2e import observer
        from torchao.quantization.pt2e.quantizer import ComposableQuantizer
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    except ImportError as exc:
        raise MissingExtraError(f"{INSTALL_HINT} ({exc})") from exc
    return x86, ComposableQuantizer, observer


def _per_tensor_weights(config: Any, observer: Any) -> Any:
    weight = dataclasses.replace(
        config.weight,
        qscheme=torch.per_tensor_symmetric,
        ch_axis=None,
        observer_or_fake_quant_ctr=observer.MinMaxObserver.with_args(eps=2**-12),
    )
    return dataclasses.replace(config, weight=weight)


def default_x86_quantizer() -> Any:
    """torchao's ``X86InductorQuantizer`` with its default static config for every module."""
    x86, _composable, _observer = _torchao()
    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())


def to_pt2e_quantizer(report: Report) -> Any:
    """A quantizer that applies ``report``'s suggestions (X86InductorQuantizer, composed when dynamic)."""
    x86, composable, observer = _torchao()
    static_config = x86.get_default_x86_inductor_quantization_config()
    dynamic_config = x86.get_default_x86_inductor_quantization_config(is_dynamic=True)
    static = x86.X86InductorQuantizer().set_global(static_config)
    dynamic = x86.X86InductorQuantizer()
    dynamic_modules = []
    for suggestion in report.suggestions:
        per_tensor = suggestion.weight is WeightScheme.PER_TENSOR
        if suggestion.keep_float:
            static.set_module_name_qconfig(suggestion.fqn, None)
        elif suggestion.activation is ActivationMode.DYNAMIC:
            config = _per_tensor_weights(dynamic_config, observer) if per_tensor else dynamic_config
            dynamic.set_module_name_qconfig(suggestion.fqn, config)
            static.set_module_name_qconfig(suggestion.fqn, None)
            dynamic_modules.append(suggestion.fqn)
        elif per_tensor:
            static.set_module_name_qconfig(suggestion.fqn, _per_tensor_weights(static_config, observer))
    if len(report.equalization_mapping):
        warnings.warn(
            "PT2E has no input-weight equalization; these modules stay unequalized: "
            + ", ".join(report.equalization_mapping.fqns),
            stacklevel=3,
        )
    return composable([dynamic, static]) if dynamic_modules else static
