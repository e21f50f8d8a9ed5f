"""Helpers that check a run: hooks left, JSON paths, host reads, warned notes, hypothesis example counts."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torch import nn
from torch.overrides import TorchFunctionMode

from qinsight.core.notes import Note, NoteKind, NoteWarning


def hooks_left(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def json_paths(value: Any, prefix: tuple[Any, ...] = (), *, leaves: bool = False) -> list[tuple[Any, ...]]:
    """The paths (keys and indices) of every node of a JSON value, or of its leaves only."""
    nested = isinstance(value, (dict, list))
    found = [] if leaves and nested else [prefix]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found += json_paths(item, (*prefix, key), leaves=leaves)
    return found


def examples(count: int) -> int:
    """A hypothesis test's examples under the loaded profile (conftest.py): ``count`` on the CI
    profile, a tenth of it (at least 5) on the quick one."""
    from hypothesis import settings

    return max(5, count * settings.default.max_examples // 100) if settings.default.max_examples < 100 else count


class HostReads(TorchFunctionMode):
    """Records every host read of a tensor's value made from Python while it is active (``item``,
    ``tolist``, ``bool``/``float``/``int`` of a tensor, ``cpu``): on a GPU each one waits for the device."""

    READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def warns_note(kind: NoteKind) -> Iterator[list[Note]]:
    """Expects a :class:`NoteWarning` of ``kind`` (its words may change, its kind not); gives the notes warned."""
    notes: list[Note] = []
    with pytest.warns(NoteWarning) as caught:
        yield notes
    notes.extend(w.message.note for w in caught if isinstance(w.message, NoteWarning))
    assert kind in [note.kind for note in notes], notes
