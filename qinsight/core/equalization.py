"""EqualizationMapping: which modules to equalize, as a type of its own.

torch expresses equalization as a QConfigMapping that gives every Linear/Conv
the default EqualizationQConfig, whatever was recommended. This mapping holds
only the modules where equalization is recommended;
:func:`qinsight.equalization_config` builds what ``prepare_fx(..., _equalization_config=...)`` takes.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from qinsight.core.suggestions import QuantSuggestion


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
