"""From a Report to a torch ``QConfigMapping`` for FX graph mode quantization.

The mapping starts from ``base`` (the backend's default mapping unless given),
so the global entry and the object-type entries are kept, and adds one
``set_module_name`` entry per suggested module. Names are the float model's
(``fc1``, the parent of a fused ``LinearReLU``): torch's ModelReport uses the
fused child's name (``fc1.0``), which ``prepare_fx`` never matches, so it
leaves fused layers in float.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from torch.ao.quantization import (
    QConfig,
    QConfigMapping,
    default_dynamic_quant_observer,
    default_per_channel_weight_observer,
    default_weight_observer,
    get_default_qconfig,
    get_default_qconfig_mapping,
)

from qinsight.core.sites import WeightScheme
from qinsight.core.suggestions import ActivationMode, QuantSuggestion

if TYPE_CHECKING:
    from qinsight.core.report import Report


def qconfig_for(suggestion: QuantSuggestion, default: QConfig) -> QConfig | None:
    """The qconfig that applies ``suggestion``; fields without an opinion keep ``default``'s choice."""
    if suggestion.keep_float:
        return None
    activation = default.activation
    if suggestion.activation is ActivationMode.DYNAMIC:
        activation = default_dynamic_quant_observer
    weight = default.weight
    if suggestion.weight is WeightScheme.PER_CHANNEL:
        weight = default_per_channel_weight_observer
    elif suggestion.weight is WeightScheme.PER_TENSOR:
        weight = default_weight_observer
    return QConfig(activation=activation, weight=weight)  # type: ignore[no-untyped-call]


def to_qconfig_mapping(report: Report, base: QConfigMapping | None = None) -> QConfigMapping:
    """A QConfigMapping that ``prepare_fx``/``convert_fx`` accept and that applies the report's suggestions."""
    backend = report.metadata.backend
    mapping = copy.deepcopy(base) if base is not None else get_default_qconfig_mapping(backend)
    default = get_default_qconfig(backend)  # type: ignore[no-untyped-call]
    for suggestion in report.suggestions:
        mapping.set_module_name(suggestion.fqn, qconfig_for(suggestion, default))
    return mapping
