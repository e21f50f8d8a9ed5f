"""Running the ``qinsight`` command as a user does: a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch


def run_cli(*args: str, cwd: Path | None = None, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    # the command runs on this process's threads: float32 sums round alike (compared to the API's numbers)
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        [sys.executable, "-m", "qinsight", *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
