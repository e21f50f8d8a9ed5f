"""Report files with typed binary arrays and gzip: lossless for every float and integer, small, and
every broken array or stream one ReportFileError naming where, read in bounded memory."""

from __future__ import annotations

import base64
import gzip
import json
import lzma
import math
import os
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from _support import MLP, examples, gaussian_batches, seeded
from hypothesis import given, settings
from hypothesis import strategies as st

import qinsight
from qinsight.outputs.arrays import SHORTEST, floats_in, floats_out, ints_in, ints_out
from qinsight.outputs.serde import report_from_json, report_to_dict

def same_floats(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Bit for bit, NaN as NaN (its payload aside) and -0.0 as -0.0."""
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or struct.pack("<d", x) == struct.pack("<d", y) for x, y in zip(a, b)
    )


def _float32_exact(value: float) -> bool:
    try:
        return math.isnan(value) or struct.unpack("<f", struct.pack("<f", value))[0] == value
    except OverflowError:
        return False


@settings(max_examples=examples(300), deadline=None)
@given(values=st.lists(st.one_of(st.floats(width=32), st.floats()), max_size=80))
def test_any_floats_come_back_bit_for_bit(values: list[float]) -> None:
    packed = floats_out(tuple(values))
    if len(values) < SHORTEST:
        assert packed is None
        return
    assert packed is not None and packed["n"] == len(values)
    assert packed["array"] == ("f4" if all(_float32_exact(v) for v in values) else "f8")
    back = floats_in(json.loads(json.dumps(packed)))
    assert same_floats(back, tuple(values))
    assert all(x is math.nan for x in back if x != x)  # one NaN object: reports with NaNs compare equal


@settings(max_examples=examples(300), deadline=None)
@given(values=st.lists(st.integers(min_value=-(2**70), max_value=2**70), min_size=SHORTEST, max_size=60))
def test_any_integers_come_back_in_the_narrowest_type_or_as_a_list(values: list[int]) -> None:
    packed = ints_out(tuple(values))
    low, high = min(values), max(values)
    if not (0 <= low and high < 2**64) and not (-(2**63) <= low and high < 2**63):
        assert packed is None  # no 64-bit type holds them all: the JSON list does
        return
    assert packed is not None and ints_in(packed) == tuple(values)
    width = {"1": 1, "2": 2, "4": 4, "8": 8}[packed["array"][1]]
    assert len(base64.b64decode(packed["base64"])) == width * len(values)


def test_a_real_report_round_trips_packed_plain_and_compressed(tmp_path: Path) -> None:
    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 3))
    sizes = {}
    for name, keywords in (
        ("plain.json", {"packed": False}), ("packed.json", {}), ("packed.json.gz", {}), ("packed.json.xz", {}),
        ("named.json", {"compress": "xz"}), ("plain.json.gz", {"compress": "none"}),
    ):
        path = tmp_path / name
        qinsight.save_report(report, path, **keywords)
        assert qinsight.load_report(path) == report
        sizes[name] = os.path.getsize(path)
    assert sizes["packed.json.xz"] < sizes["packed.json.gz"] < sizes["packed.json"] < sizes["plain.json"] / 2
    assert (tmp_path / "packed.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert (tmp_path / "named.json").read_bytes() == (tmp_path / "packed.json.xz").read_bytes()
    assert (tmp_path / "plain.json.gz").read_bytes() == (tmp_path / "packed.json").read_bytes()
    with pytest.raises(qinsight.InvalidParameterError, match="compress='zip'"):
        qinsight.save_report(report, tmp_path / "r.zip", compress="zip")  # type: ignore[arg-type]
    qinsight.save_report(report, tmp_path / "again.json.gz")  # no time stamp: the same bytes again
    assert (tmp_path / "again.json.gz").read_bytes() == (tmp_path / "packed.json.gz").read_bytes()
    assert '"array": "f4"' in (tmp_path / "packed.json").read_text()  # float32 activations' minima, exactly


def _with_first_array(report: qinsight.Report, change: dict[str, Any]) -> str:
    data = report_to_dict(report)

    def visit(value: Any) -> bool:
        if isinstance(value, dict) and "base64" in value:
            value.update(change)
            return True
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return any(visit(child) for child in children)

    assert visit(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"array": "f16"}, "one of f4, f8, not 'f16'"),
        ({"n": 3}, "at least 16"),
        ({"n": 10**9}, "base64 characters"),
        ({"base64": "!!!!"}, "base64 characters"),
        ({"extra": 1}, "exactly the keys"),
        ({"n": True}, "whole number"),
    ],
)
def test_a_broken_typed_array_is_one_error_naming_where(change: dict[str, Any], problem: str) -> None:
    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 2))
    with pytest.raises(qinsight.ReportFileError, match=problem) as info:
        report_from_json(_with_first_array(report, change), source="r.json")
    assert info.value.location is not None and info.value.location.startswith("$.")


@pytest.mark.parametrize(("suffix", "squeeze"), [(".gz", lambda b: gzip.compress(b, mtime=0)), (".xz", lzma.compress)])
def test_a_broken_or_explosive_stream_is_one_error_in_bounded_memory(suffix: str, squeeze: Any, tmp_path: Path) -> None:
    report = qinsight.diagnose(seeded(MLP()), gaussian_batches((8, 16), 2))
    good = tmp_path / f"r.json{suffix}"
    qinsight.save_report(report, good)
    cut = tmp_path / f"cut.json{suffix}"
    cut.write_bytes(good.read_bytes()[:-20])
    with pytest.raises(qinsight.ReportFileError, match="cut short|does not decompress"):
        qinsight.load_report(cut)
    bomb = tmp_path / f"bomb.json{suffix}"
    bomb.write_bytes(squeeze(b" " * (64 * 2**20)))  # 64 MiB of spaces in a few KiB
    tracemalloc.start()
    try:
        with pytest.raises(qinsight.ReportFileError, match="decompresses to more than the 1048576-byte limit"):
            qinsight.load_report(bomb, max_bytes=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, peak  # the limit, and xz's dictionary (8 MiB at the default preset)
    garbage = tmp_path / f"garbage.json{suffix}"
    garbage.write_bytes(good.read_bytes()[:6] + os.urandom(200))
    with pytest.raises(qinsight.ReportFileError, match="gzip|xz"):
        qinsight.load_report(garbage)
