"""The pasteable Python that builds an advice's torch config: the lines the HTML page shows.

Made from the same entries as :func:`qinsight.apply.qconfigs.qconfig_mapping`
(:func:`~qinsight.apply.qconfigs.advice_entries`), so the code builds the same
``QConfigMapping``, and ``equalization`` the same config as
:func:`qinsight.apply.equalization_qconfig`.
"""

from __future__ import annotations

from qinsight.apply.qconfigs import MappingEntry, advice_entries
from qinsight.core.advice import Advice
from qinsight.core.equalization import EqualizationMapping
from qinsight.core.fx_activations import FxActivations


def config_code(advice: Advice) -> list[str]:
    """Python lines that build ``mapping`` (FX) as :func:`~qinsight.apply.qconfigs.qconfig_mapping` does, and
    ``equalization`` where the advice equalizes; a smoothed plan's lines say the model must be smoothed first,
    a bias-corrected config's that its biases must be corrected."""
    entries = advice_entries(advice.sites, advice.suggestions, advice.backend, advice.fx_activations)
    preamble = []  # what the model goes through first, in the order qinsight.quantize applies it
    if advice.bias_correction.entries:
        preamble.append(
            f"# for the model with its biases corrected: model = qinsight.bias_corrected(model, {advice.source})"
        )
    if advice.smoothing.entries:
        preamble.append("# for the smoothed model: model = qinsight.smoothed(model, plan)")
    return preamble + _code(entries, advice.backend, advice.fx_activations) + equalization_code(advice.equalization)


def equalization_code(mapping: EqualizationMapping) -> list[str]:
    """Python lines that build ``equalization``, prepare_fx's ``_equalization_config``; none if it is empty."""
    if not mapping.entries:
        return []
    lines = [
        "",
        "# input-weight equalization: prepare_fx(..., _equalization_config=equalization)",
        "from torch.ao.quantization import QConfigMapping",
        "from torch.ao.quantization.fx._equalize import default_equalization_qconfig",
        "equalization = QConfigMapping()",
    ]
    return lines + [f"equalization.set_module_name({fqn!r}, default_equalization_qconfig)" for fqn in mapping.fqns]


def _code(entries: list[MappingEntry], backend: str, activations: FxActivations | None = None) -> list[str]:
    lines = [
        "import operator",
        "import torch",
        "import torch.nn.functional as F",
        "from torch.ao.quantization import (",
        "    QConfig, default_dynamic_quant_observer, default_per_channel_weight_observer,",
        "    default_weight_observer, float_qparams_weight_only_qconfig, get_default_qconfig,",
        "    get_default_qconfig_mapping,",
        ")",
    ]
    default = f"get_default_qconfig({backend!r})"
    if activations is not None:
        lines += [
            "from torch.ao.quantization.observer import HistogramObserver",
            "from qinsight.apply.clipped import ClippedHistogramObserver",
        ]
        default = (
            f"QConfig(activation=HistogramObserver.with_args(reduce_range={activations.bits < 8}), "
            f"weight=get_default_qconfig({backend!r}).weight)"
        )
    lines += ["", f"default = {default}", f"mapping = get_default_qconfig_mapping({backend!r})"]
    lines += [f"mapping.{e.setter}({', '.join((*e.key_code, e.choice.code))})" for e in entries]
    return lines


__all__ = ["config_code", "equalization_code"]
