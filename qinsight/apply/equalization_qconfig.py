"""An :class:`~qinsight.core.equalization.EqualizationMapping` as prepare_fx's ``_equalization_config``."""

from __future__ import annotations

from torch.ao.quantization import QConfigMapping
from torch.ao.quantization.fx._equalize import default_equalization_qconfig

from qinsight.core.equalization import EqualizationMapping


def equalization_qconfig_mapping(mapping: EqualizationMapping) -> QConfigMapping | None:
    """The ``_equalization_config`` argument of ``prepare_fx`` that equalizes ``mapping``'s modules;
    ``None`` (equalize nothing) when it is empty.

    torch expresses equalization as a QConfigMapping that gives every Linear/Conv
    the default EqualizationQConfig; this one names only the mapping's modules.
    """
    if not mapping.entries:
        return None
    config = QConfigMapping()
    for entry in mapping.entries:
        # torch stores EqualizationQConfigs in a QConfigMapping too, though its annotations only admit QConfig.
        config.set_module_name(entry.fqn, default_equalization_qconfig)  # type: ignore[arg-type]
    return config


__all__ = ["equalization_qconfig_mapping"]
