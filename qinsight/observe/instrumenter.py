"""Instrumentation: one observer per slot, attached through the frontend.

Insert points that share a slot (same module, side and channel axis) share one
observer whose spec is the union of theirs, so two detectors asking for the
same activation never make it be read twice, and which observer serves a
request never depends on iteration order (torch's ModelReport lets the last
detector of a ``set`` win). Slots are kept in the order detectors asked.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import attrs
import torch

from qinsight.core.errors import ObserverError
from qinsight.core.sites import InsertPoint, ObserverSpec, Side, observer_key
from qinsight.core.stats import ActivationStats, Observation, ObservedStats
from qinsight.observe.format_errors import format_errors
from qinsight.observe.observers import ActivationObserver, BatchClock
from qinsight.plugin.detector import Detach, ModelView

# Observers of one tensor run close together (pre-hooks of the modules reading it, with the
# post-hooks of the ones before in between): the last few measurements are kept for them.
_RECENT = 4


class Instrumenter:
    """Attaches observers for a set of insert points and detaches them all again."""

    def __init__(self, view: ModelView, points: Iterable[InsertPoint]) -> None:
        self._view = view
        specs: dict[tuple[str, Side, int], ObserverSpec] = {}
        for point in points:
            view.site(point.fqn)  # fail early, naming the unknown module
            known = specs.get(point.slot)
            specs[point.slot] = point.spec if known is None else known.union(point.spec)
        self.clock = BatchClock()
        self._observers: dict[tuple[str, Side, int], ActivationObserver] = {}
        for (fqn, side, axis), spec in specs.items():
            default_axis = 0 if side is Side.WEIGHT else view.site(fqn).channel_axis
            self._observers[(fqn, side, axis)] = ActivationObserver(
                spec, observer_key(fqn, side, axis, default_axis), self.clock
            )
        self._detach: list[Detach] = []
        self._errors: list[ObserverError] = []
        self._recent: list[tuple[weakref.ref[torch.Tensor], tuple[int, ObserverSpec], torch.Tensor | None]] = []

    @property
    def observers(self) -> tuple[ActivationObserver, ...]:
        return tuple(self._observers.values())

    def attach(self) -> None:
        try:
            for (fqn, side, _), observer in self._observers.items():
                if side is not Side.WEIGHT:
                    self._detach.append(self._view.attach(fqn, side, self._guarded(observer)))
        except BaseException:
            self.detach()
            raise

    def _guarded(self, observer: ActivationObserver) -> Callable[[torch.Tensor], None]:
        """``observer.observe`` with the measurement shared (:meth:`_summary`), keeping an :class:`ObserverError`
        instead of raising it inside the model's forward: when the batch is wrong the model's own error says
        more (a shape mismatch, in its words)."""

        def observe(x: torch.Tensor) -> None:
            try:
                summary = self._summary(observer, x)
                if summary is not None:
                    observer.fold(summary)
            except ObserverError as exc:
                self._errors.append(exc)

        return observe

    def _summary(self, observer: ActivationObserver, x: torch.Tensor) -> torch.Tensor | None:
        """``observer.measure(x)``, measured once for every observer of the same tensor with the same spec
        (the q, k and v projections read one tensor: three observers, one pass over it)."""
        if not isinstance(x, torch.Tensor):  # a hook may pass anything: measure() tells
            return observer.measure(x)  # type: ignore[unreachable]
        key = (x._version, observer.spec)  # an in-place change of x between two observers is a new batch
        for tensor, known, summary in self._recent:
            if tensor() is x and known == key:
                return summary
        summary = observer.measure(x)
        # weak references: the memo must neither keep activations alive nor take a new tensor for an old one
        self._recent = [(weakref.ref(x), key, summary), *self._recent[: _RECENT - 1]]
        return summary

    def take_error(self) -> ObserverError | None:
        """The first observer error since the last call, if any."""
        errors, self._errors = self._errors, []
        return errors[0] if errors else None

    def detach(self) -> None:
        """Remove every observer; safe to call more than once."""
        while self._detach:
            self._detach.pop()()

    def freeze(self) -> ObservedStats:
        return ObservedStats(
            observations=tuple(
                Observation(key=observer.key, fqn=fqn, side=side, stats=self._frozen(fqn, side, observer))
                for (fqn, side, _), observer in self._observers.items()
            )
        )

    def _frozen(self, fqn: str, side: Side, observer: ActivationObserver) -> ActivationStats:
        if side is not Side.WEIGHT:
            return observer.freeze()
        weight = ActivationObserver(observer.spec, observer.key)  # the weight now, as one batch
        tensor = self._view.weight(fqn)
        weight.observe(weight_rows(tensor, self._view.site(fqn).groups))
        frozen = weight.freeze()
        return (
            attrs.evolve(frozen, formats=format_errors(tensor, observer.spec.formats))
            if observer.spec.formats
            else frozen
        )


def weight_rows(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """``weight`` as one row per input channel, holding the weights that read it (its own group's outputs only)."""
    out_channels, in_per_group = weight.shape[0], weight.shape[1]
    grouped = weight.detach().reshape(groups, out_channels // groups, in_per_group, -1)
    return grouped.transpose(1, 2).reshape(groups * in_per_group, -1)
