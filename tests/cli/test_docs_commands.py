"""Every command the README and docs/*.md show in a ``bash`` block runs as written, with the defaults a
user gets: no ``QINSIGHT_*`` variable, progress on stderr (a log, and once a terminal), verification on.

Each file's lines run in order in one empty folder, so ``show report.json`` follows the line that
wrote it. A line is skipped only where it names a placeholder (``mypkg``, ``path/to``...) or needs an
extra that is not installed; a line whose comment says it may exit 1 (a plan that misses its target)
may, every other line exits 0, and each file named by ``--out``/``--html`` exists afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import pty
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
INSTALL = re.compile(r"^python -m pip install [^&]*&& ")  # a README line installs first, as a fresh machine needs
COMMAND = re.compile(r"^(python -m qinsight|qinsight|torchrun .*-m qinsight)\b")
PLACEHOLDERS = ("mypkg", "mymodels", "path/to", "m:build", "...", "PKG.MOD", "FILE.")
EXTRAS = {
    "pt2e": "torchao",
    "--flow torchao": "torchao",
    "xnnpack": "executorch",
    "--lowered": "torchao",
    "--hf": "transformers",
}  # a flag in the line: the module it needs


def commands(doc: Path) -> list[str]:
    """The ``qinsight`` lines of ``doc``'s bash blocks, continuation lines joined, comments kept."""
    found = []
    for block in re.findall(r"^ *```bash\n(.*?)^ *```", doc.read_text(), re.MULTILINE | re.DOTALL):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if COMMAND.match(INSTALL.sub("", line.strip())):
                found.append(line.strip())
    return found


def runnable(line: str) -> bool:
    if any(marker in line.split("#")[0] for marker in PLACEHOLDERS):
        return False
    return all(importlib.util.find_spec(module) is not None for flag, module in EXTRAS.items() if flag in line)


def user_environment() -> dict[str, str]:
    """This environment as a user's shell has it: the project's Python first on PATH, no QINSIGHT_*."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("QINSIGHT_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def written(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word in ("--out", "--html")]


def test_the_docs_show_the_commands_a_user_starts_with() -> None:
    shown = {doc.name: commands(doc) for doc in DOCS}
    assert shown["README.md"][0] == (
        "python -m pip install -q torch==2.13.0 -e . && python -m qinsight diagnose --example encoder --html "
        "report.html"
    )
    assert sum(runnable(line) for line in shown["cli.md"]) >= 12  # the examples of every command


# README.md's commands in the fast tier; every other page's (minutes of subprocesses) in the whole suite's
@pytest.mark.parametrize(
    "doc",
    [
        doc if doc.name == "README.md" else pytest.param(doc, marks=pytest.mark.slow)
        for doc in DOCS
        if any(runnable(line) for line in commands(doc))
    ],
    ids=lambda doc: doc.name,
)
def test_every_documented_command_runs_as_written(doc: Path, tmp_path: Path) -> None:
    env = user_environment()
    for line in filter(runnable, commands(doc)):  # installed already: the command itself runs
        result = subprocess.run(
            ["bash", "-c", INSTALL.sub("", line)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        allowed = (0, 1) if "exit 1" in line.partition("#")[2] else (0,)  # where the docs say it may
        assert result.returncode in allowed, f"{line}\n{result.stderr}"
        assert "Traceback" not in result.stderr, f"{line}\n{result.stderr}"
        for name in written(line):
            assert (tmp_path / name).is_file(), f"{line} did not write {name}"


def test_the_first_command_on_a_terminal_rewrites_one_progress_line_per_stage(tmp_path: Path) -> None:
    """The README's first command with stderr on a pseudo-terminal, as at a prompt."""
    first = INSTALL.sub("", commands(ROOT / "README.md")[0])
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            ["bash", "-c", first],
            cwd=tmp_path,
            env=user_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=terminal,
        )
        os.close(terminal)
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the terminal's other end closed: the command is done
                break
            if not chunk:
                break
            shown += chunk
        assert process.wait(timeout=300) == 0, shown.decode(errors="replace")
    finally:
        os.close(controller)
    text = shown.decode()
    stages = (
        "calibrating: 8/8, ",
        "checking the FX kernels for saturation: 1/1, ",
        "verifying the report's config in fx: 1/1, ",
    )
    assert all(f"\r{stage}" in text for stage in stages), text
    assert text.count("\r\n") >= len(stages) and "Traceback" not in text  # each stage's line ended
    assert (tmp_path / "report.html").is_file()
