"""The qinsight command, run as a real subprocess."""

from __future__ import annotations

import subprocess
import sys


def qinsight(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qinsight", *args], capture_output=True, text=True, timeout=300)


def test_diagnose_example_prints_the_report() -> None:
    result = qinsight("diagnose", "--example", "encoder")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("qinsight report: encoder (fx frontend, backend x86, 8 calibration batches")
    assert "dynamic recommended (1):" in result.stdout
    assert "head  S_in=" in result.stdout


def test_bad_arguments_exit_2_with_one_line() -> None:
    result = qinsight("diagnose", "--example", "cnn", "--batches", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == "qinsight: error: --batches must be at least 1"
    result = qinsight("diagnose", "--example", "cnn", "--backend", "tpu")
    assert result.returncode == 2
    assert "backend='tpu' is invalid" in result.stderr and "Traceback" not in result.stderr
