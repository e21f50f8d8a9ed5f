"""The one progress callback every long call takes (``diagnose``, ``instrument``'s calibration, ``plan``).

``progress(stage, done, total)``: the stage's name (``"calibrating"``, ``"measuring
sensitivity"``...), the steps done in it, and how many there are (0 where that is not known, as
for calibration batches from an iterator). A stage's first call has ``done == 0`` where the stage
knows it is starting; every call comes from the calling thread.
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]

__all__ = ["Progress"]
