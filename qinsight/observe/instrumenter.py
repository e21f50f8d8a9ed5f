"""Instrumentation: one observer per slot, attached through the frontend.

Insert points that share a slot (same module, side and channel axis) share one
observer whose spec is the union of theirs, so two detectors asking for the
same activation never make it be read twice, and which observer serves a
request never depends on iteration order (torch's ModelReport lets the last
detector of a ``set`` win). Slots are kept in the order detectors asked.
"""

from __future__ import annotations

from collections.abc import Iterable

from qinsight.core.sites import InsertPoint, ObserverSpec, Side, observer_key
from qinsight.core.stats import Observation, ObservedStats
from qinsight.observe.observers import ActivationObserver
from qinsight.plugin.detector import Detach, ModelView


class Instrumenter:
    """Attaches observers for a set of insert points and detaches them all again."""

    def __init__(self, view: ModelView, points: Iterable[InsertPoint]) -> None:
        self._view = view
        specs: dict[tuple[str, Side, int], ObserverSpec] = {}
        for point in points:
            view.site(point.fqn)  # fail early, naming the unknown module
            known = specs.get(point.slot)
            specs[point.slot] = point.spec if known is None else known.union(point.spec)
        self._observers: dict[tuple[str, Side, int], ActivationObserver] = {}
        for (fqn, side, axis), spec in specs.items():
            key = observer_key(fqn, side, axis, view.site(fqn).channel_axis)
            self._observers[(fqn, side, axis)] = ActivationObserver(spec, key)
        self._detach: list[Detach] = []

    @property
    def observers(self) -> tuple[ActivationObserver, ...]:
        return tuple(self._observers.values())

    def attach(self) -> None:
        try:
            for (fqn, side, _), observer in self._observers.items():
                self._detach.append(self._view.attach(fqn, side, observer.observe))
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        """Remove every observer; safe to call more than once."""
        while self._detach:
            self._detach.pop()()

    def freeze(self) -> ObservedStats:
        return ObservedStats(
            observations=tuple(
                Observation(key=observer.key, fqn=fqn, side=side, stats=observer.freeze())
                for (fqn, side, _), observer in self._observers.items()
            )
        )
