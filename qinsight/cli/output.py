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

from qinsight.core.errors import UsageError, printable


def write(text: str) -> None:
    sys.stdout.write(printable(text))


def note(message: str) -> None:
    print(f"qinsight: {printable(message)}", file=sys.stderr)


def error_line(message: str) -> None:
    """``qinsight: error: message`` on one line of stderr."""
    print(f"qinsight: error: {printable(' '.join(str(message).split()))}", file=sys.stderr)


class Progress:
    """A run's stages on stderr: each stage's steps done (of all, where known), their rate and an ETA.

    Every long call reports through it (``diagnose``: calibrating, then verifying its config;
    ``plan``: its stages). On a terminal one line is rewritten in place, a new one for each stage; in
    a log (stderr not a terminal) a line at a stage's first call, at every tenth of its steps (at
    powers of two where their number is unknown) and at its last, so a log shows where a run is
    without flooding. :meth:`finish` ends the last line.
    """

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.stage = ""
        self.start = self.now = time.perf_counter()
        self.done = self.total = 0
        self.printed = -1  # the step of the stage's last line in a log; -1: none yet

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.stage:
            self.finish()
            self.stage, self.start, self.printed = stage, time.perf_counter(), -1
        self.done, self.total, self.now = done, total, time.perf_counter()
        if self.tty:
            print(f"\r{self._line()}\x1b[K", end="", file=sys.stderr, flush=True)
        elif self._worth_a_line():
            self._print()

    def _line(self) -> str:
        elapsed = self.now - self.start  # to the stage's last step: a line printed later says the same
        of = f"/{self.total}" if self.total else ""
        # a rate and an ETA only once a step is done: a stage's first call (0 done) has neither
        rate = f", {self.done / elapsed:.1f}/s" if self.done and elapsed > 0 else ""
        eta = (
            f", ETA {elapsed / self.done * (self.total - self.done):.0f}s"
            if self.done and self.total > self.done
            else ""
        )
        return f"{self.stage}: {self.done}{of}{rate}{eta}"

    def _worth_a_line(self) -> bool:
        if self.printed < 0 or self.done == self.total:
            return True
        if self.total:
            return self.done - self.printed >= max(self.total // 10, 1)
        return self.done & (self.done - 1) == 0

    def _print(self) -> None:
        print(self._line(), file=sys.stderr, flush=True)
        self.printed = self.done

    def finish(self) -> None:
        """Ends the stage's line: on a terminal a newline; in a log, its last count if not printed yet."""
        if not self.stage:
            return
        if self.tty:
            print(file=sys.stderr, flush=True)
        elif self.done != self.printed:
            self._print()
        self.stage = ""


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
