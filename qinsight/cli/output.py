"""What the command writes: text on the terminal, progress, files.

Everything printed goes through :func:`write` or :func:`error_line`, which
escape control characters: a module name from a report file cannot move the
cursor or recolour the terminal.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from qinsight.core.errors import UsageError
from qinsight.outputs.text import printable


def write(text: str) -> None:
    sys.stdout.write(printable(text))


def note(message: str) -> None:
    print(f"qinsight: {printable(message)}", file=sys.stderr)


def error_line(message: str) -> None:
    """``qinsight: error: message`` on one line of stderr."""
    print(f"qinsight: error: {printable(' '.join(str(message).split()))}", file=sys.stderr)


class Progress:
    """Batches done, rate, and an ETA when the number of batches is known, on stderr.

    On a terminal one line is rewritten in place; in a log (stderr not a
    terminal) a line is printed at every tenth of the batches, or at powers of
    two when their number is unknown. :meth:`finish` ends the line, and in a log
    prints the last count if it was not printed yet.
    """

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.open = False
        self.done = 0
        self.printed = 0

    def _line(self, done: int) -> str:
        rate = done / max(time.perf_counter() - self.start, 1e-9)
        of = f"/{self.total}" if self.total else ""
        eta = f", ETA {max(self.total - done, 0) / rate:.0f}s" if self.total else ""
        return f"calibrating: {done}{of} batches, {rate:.1f} batch/s{eta}"

    def _worth_a_line(self, done: int) -> bool:
        if self.total:
            step = max(self.total // 10, 1)
            return done % step == 0 or done == self.total
        return done & (done - 1) == 0

    def __call__(self, _stage: str, done: int, total: int) -> None:
        self.total = self.total or total or None
        self.done = done
        if self.tty:
            print(f"\r{self._line(done)}", end="", file=sys.stderr, flush=True)
            self.open = True
        elif self._worth_a_line(done):
            print(self._line(done), file=sys.stderr, flush=True)
            self.printed = done

    def finish(self) -> None:
        if self.open:
            print(file=sys.stderr, flush=True)
            self.open = False
        elif not self.tty and self.done != self.printed:
            print(self._line(self.done), file=sys.stderr, flush=True)
            self.printed = self.done


class StageProgress:
    """A plan's stages on stderr: the stage, steps done of all, and an ETA for the stage.

    On a terminal one line is rewritten in place; in a log, a line per stage
    and per tenth of its steps."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.stage = ""
        self.start = time.perf_counter()
        self.printed = -1

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.stage:
            if self.tty and self.stage:
                print(file=sys.stderr, flush=True)
            self.stage, self.start, self.printed = stage, time.perf_counter(), -1
        elapsed = time.perf_counter() - self.start
        eta = f", ETA {elapsed / done * (total - done):.0f}s" if done and total > done else ""
        line = f"{stage}: {done}/{total}{eta}"
        if self.tty:
            print(f"\r{line}\x1b[K", end="", file=sys.stderr, flush=True)
        elif done == 0 or done - self.printed >= max(total // 10, 1):
            print(line, file=sys.stderr, flush=True)
            self.printed = done

    def finish(self) -> None:
        if self.tty and self.stage:
            print(file=sys.stderr, flush=True)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_targets(targets: Iterable[str | None], inputs: Iterable[str]) -> None:
    """Refuse output paths that would overwrite an input file, or one another."""
    chosen = [t for t in targets if t]
    for target in chosen:
        for source in inputs:
            if _same_file(target, source):
                raise UsageError(f"{target} is an input of this command; write to another file")
    for index, target in enumerate(chosen):
        if any(_same_file(target, other) for other in chosen[:index]):
            raise UsageError(f"{target} is named for two outputs")


def wrote(path: str) -> None:
    note(f"wrote {path}")
