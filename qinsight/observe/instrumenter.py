"""Instrumentation: one observer per slot, attached through the frontend.

Insert points that share a slot (same module, side and channel axis) share one
observer whose spec is the union of theirs, so two detectors asking for the
same activation never make it be read twice, and which observer serves a
request never depends on iteration order (torch's ModelReport lets the last
detector of a ``set`` win). Slots are kept in the order detectors asked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from qinsight.core.errors import ObserverError
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
        self._errors: list[ObserverError] = []

    @property
    def observers(self) -> tuple[ActivationObserver, ...]:
        return tuple(self._observers.values())

    def attach(self) -> None:
        try:
            for (fqn, side, _), observer in self._observers.items():
                self._detach.append(self._view.attach(fqn, side, self._guarded(observer)))
        except BaseException:
            self.detach()
            raise

    def _guarded(self, observer: ActivationObserver) -> Callable[[torch.Tensor], None]:
        """``observer.observe``, keeping an :class:`ObserverError` instead of raising it inside the model's
        forward: when the batch is wrong the model's own error says more (a shape mismatch, in its words)."""

        def observe(x: torch.Tensor) -> None:
            try:
                observer.observe(x)
            except ObserverError as exc:
                self._errors.append(exc)

        return observe

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
                Observation(key=observer.key, fqn=fqn, side=side, stats=observer.freeze())
                for (fqn, side, _), observer in self._observers.items()
            )
        )
