"""EqualizationMapping: which modules to equalize, as a type of its own.

torch expresses equalization as a QConfigMapping that gives every Linear/Conv
the default EqualizationQConfig, whatever was recommended. This mapping holds
only the modules where equalization is recommended; :meth:`to_torch` builds
what ``prepare_fx(..., _equalization_config=...)`` takes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from qinsight.core.suggestions import QuantSuggestion

if TYPE_CHECKING:
    from torch.ao.quantization import QConfigMapping


@attrs.frozen(kw_only=True)
class EqualizationEntry:
    """Equalize the input of ``fqn`` with its weight; ``sources`` are the detectors that asked."""

    fqn: str
    sources: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class EqualizationRefusal:
    """A suggested equalization left out because torch cannot apply it as it is: applied by
    ``prepare_fx``'s own equalization, it changes what the float model computes (or torch skips
    it). ``reason`` says what was measured; ``sources`` are the detectors that asked."""

    fqn: str
    reason: str
    sources: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class EqualizationMapping:
    """The modules whose suggestion says ``equalize``, in forward order; ``refused``: the
    suggested ones torch cannot apply, with the reason."""

    entries: tuple[EqualizationEntry, ...] = ()
    refused: tuple[EqualizationRefusal, ...] = ()

    @classmethod
    def of(cls, suggestions: Iterable[QuantSuggestion]) -> EqualizationMapping:
        """The modules of ``suggestions`` that say equalize, in their order."""
        return cls(entries=tuple(EqualizationEntry(fqn=s.fqn, sources=s.sources) for s in suggestions if s.equalize))

    @property
    def fqns(self) -> tuple[str, ...]:
        return tuple(entry.fqn for entry in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, fqn: object) -> bool:
        return fqn in self.fqns

    def to_torch(self) -> QConfigMapping:
        """The ``_equalization_config`` argument of ``torch.ao.quantization.quantize_fx.prepare_fx``."""
        from torch.ao.quantization import QConfigMapping
        from torch.ao.quantization.fx._equalize import default_equalization_qconfig

        mapping = QConfigMapping()
        for entry in self.entries:
            # torch stores EqualizationQConfigs in a QConfigMapping too, though
            # its annotations only admit QConfig.
            mapping.set_module_name(entry.fqn, default_equalization_qconfig)  # type: ignore[arg-type]
        return mapping
