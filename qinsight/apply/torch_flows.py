"""Each flow's torch side, one record per flow: which configs it takes, the config of some advice,
its default config for a backend, how it prepares a model with a config, how it converts.

What a flow can express, whether it exports, whether it lowers: its torch-free
:class:`~qinsight.core.flows.FlowSpec` (:attr:`TorchFlow.spec`). A config picks its flow by what it
is: a ``QConfigMapping`` is FX's (``prepare_fx``/``convert_fx``), a torchao ``Quantizer``, composed or
not, PT2E's (``torch.export``, then ``prepare_pt2e``/``convert_pt2e``), a torchao ``quantize_`` config
or qinsight's :class:`~qinsight.compare.torchao_flow.Int8Recipe` torchao's. The programs a backend
lowers to: :mod:`qinsight.compare.programs` and :mod:`qinsight.backends`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn
from torch.ao.quantization import QConfigMapping

from qinsight.apply.pt2e import pt2e_quantizer
from qinsight.apply.qconfigs import qconfig_mapping
from qinsight.apply.torchao import int8_dynamic, int8_recipe
from qinsight.compare.torchao_flow import convert_torchao, is_torchao_config, prepare_torchao
from qinsight.core.advice import Advice
from qinsight.core.backend import is_quantizer
from qinsight.core.errors import InvalidParameterError
from qinsight.core.flows import FLOW_SPECS, FlowSpec, fx_engine, pt2e_quantizers
from qinsight.core.sites import FlowName
from qinsight.frontends import separate_shared_calls


def _prepare_fx(
    model: nn.Module, config: object, example: tuple[Any, ...], _shapes: Any, equalization: Any
) -> nn.Module:
    from torch.ao.quantization.quantize_fx import prepare_fx

    copied = copy.deepcopy(model).eval()
    return prepare_fx(copied, config, example, _equalization_config=equalization)  # type: ignore[arg-type]


def _convert_fx(prepared: nn.Module) -> nn.Module:
    from torch.ao.quantization.quantize_fx import convert_fx

    return convert_fx(prepared)  # type: ignore[arg-type]


def _prepare_pt2e(
    model: nn.Module, config: object, example: tuple[Any, ...], shapes: Any, _equalization: Any
) -> nn.Module:
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    copied = copy.deepcopy(model).eval()
    settings: Any = getattr(copied, "config", None)  # a Hugging Face model's
    if getattr(settings, "use_cache", False):  # its DynamicCache is no pytree torch.export returns; one forward
        settings.use_cache = False  # over a whole batch needs no cache, and gives the same logits
    exported = torch.export.export(copied, example, dynamic_shapes=shapes).module()
    prepared: nn.Module = prepare_pt2e(separate_shared_calls(exported), config)
    return prepared


def _convert_pt2e(prepared: nn.Module) -> nn.Module:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    converted: nn.Module = convert_pt2e(prepared)
    return converted


def release_fx_graphs() -> None:
    """Let go of the graphs torch's FX quantization remembers. torch 2.13 caches the device of every
    module ``prepare_fx``/``convert_fx`` asks about (``assert_and_get_unique_device`` is a
    ``functools.cache``), so each prepared and converted graph, its folded weights and observers
    included, stays alive: a MobileNetV2 FX plan, which prepares hundreds of configs, held 677 of them
    and 20 GB. Called after each prepare or convert a search makes."""
    from torch.ao.quantization.fx import utils

    clear = getattr(getattr(utils, "assert_and_get_unique_device", None), "cache_clear", None)
    if clear is not None:
        clear()


def _fx_default(backend: str) -> tuple[object, str]:
    from torch.ao.quantization import get_default_qconfig_mapping

    return get_default_qconfig_mapping(fx_engine(backend)), f"{backend} default"


def _pt2e_default(backend: str) -> tuple[object, str]:
    quantizers = pt2e_quantizers("compare", backend)
    return quantizers.default(), quantizers.default_name


def _torchao_default(_backend: str) -> tuple[object, str]:
    return int8_dynamic(), "torchao Int8DynamicActivationInt8WeightConfig"


@attrs.frozen(kw_only=True)
class TorchFlow:
    """One flow's torch side: ``takes`` a config; ``config_of`` advice; its ``default`` config for a
    backend and that config's name; ``prepare(model, config, example, dynamic_shapes, equalization)`` a
    copy of the model (the user's is never changed); ``convert`` the calibrated one."""

    spec: FlowSpec
    takes: Callable[[object], bool]
    config_of: Callable[[Advice], object]
    default: Callable[[str], tuple[object, str]]
    prepare: Callable[[nn.Module, object, tuple[Any, ...], Any, Any], nn.Module]
    convert: Callable[[nn.Module], nn.Module]

    @property
    def name(self) -> FlowName:
        return self.spec.name


TORCH_FLOWS: dict[FlowName, TorchFlow] = {
    flow.name: flow
    for flow in (
        TorchFlow(
            spec=FLOW_SPECS["fx"],
            takes=lambda config: isinstance(config, QConfigMapping),
            config_of=qconfig_mapping,
            default=_fx_default,
            prepare=_prepare_fx,
            convert=_convert_fx,
        ),
        TorchFlow(
            spec=FLOW_SPECS["pt2e"],
            takes=is_quantizer,
            config_of=pt2e_quantizer,
            default=_pt2e_default,
            prepare=_prepare_pt2e,
            convert=_convert_pt2e,
        ),
        TorchFlow(
            spec=FLOW_SPECS["torchao"],
            takes=is_torchao_config,
            config_of=int8_recipe,
            default=_torchao_default,
            prepare=prepare_torchao,
            convert=convert_torchao,
        ),
    )
}


def flow_of(config: object, owner: str = "compare_configs", argument: str = "configs") -> TorchFlow:
    """The flow that takes ``config``, or one :class:`InvalidParameterError` saying what is taken."""
    for flow in TORCH_FLOWS.values():
        if flow.takes(config):
            return flow
    expected = "a QConfigMapping, a torchao Quantizer or a torchao quantize_ config"
    raise InvalidParameterError(owner, argument, type(config).__name__, expected)


def prepare_config(
    model: nn.Module,
    config: object,
    example_inputs: tuple[Any, ...],
    dynamic_shapes: Any = None,
    equalization: QConfigMapping | None = None,
) -> tuple[nn.Module, TorchFlow]:
    """The prepared copy of ``model`` under ``config`` (FX with ``equalization`` as prepare_fx's
    ``_equalization_config``; PT2E exported with ``dynamic_shapes``), and the flow that prepared it."""
    flow = flow_of(config)
    return flow.prepare(model, config, example_inputs, dynamic_shapes, equalization), flow


__all__ = ["TORCH_FLOWS", "TorchFlow", "flow_of", "prepare_config", "release_fx_graphs"]
