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
from _checks import examples
from _data import gaussian_batches
from _models import MLP, seeded
from hypothesis import given, settings
from hypothesis import strategies as st

import qinsight
from qinsight.detectors.outliers import ChannelStatus
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
        ("plain.json", {"packed": False}),
        ("packed.json", {}),
        ("packed.json.gz", {}),
        ("packed.json.xz", {}),
        ("named.json", {"compress": "xz"}),
        ("plain.json.gz", {"compress": "none"}),
    ):
        path = tmp_path / name
        qinsight.save_report(report, path, **keywords)
        assert qinsight.load_report(path) == report
        sizes[name] = os.path.getsize(path)
    assert sizes["packed.json.xz"] < sizes["packed.json.gz"] < sizes["packed.json"] < sizes["plain.json"] / 2
    assert (tmp_path / "packed.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert (tmp_path / "named.json").read_bytes() == (tmp_path / "packed.json.xz").read_bytes()
    assert (tmp_path / "plain.json.gz").read_bytes() == (tmp_path / "packed.json").read_bytes()
    with pytest.raises(qinsight.errors.InvalidParameterError, match="compress='zip'"):
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
        ({"array": "f16"}, "type is one of f4, f8, u1, .*, not 'f16'"),
        (
            {"array": "u2", "n": 16, "base64": "A" * 43 + "="},
            "of this field is one of f4, f8, not 'u2'",
        ),  # a float field
        ({"n": 3}, "at least 16"),
        ({"n": 10**9}, "base64 characters"),
        ({"base64": "!!!!"}, "base64 characters"),
        (
            {"array": "u1", "n": 16, "base64": "\x80" + "A" * 23},
            "base64 does not decode",
        ),  # not ASCII: found mutating a file
        ({"array": "u2", "n": 16, "base64": "A" * 44}, "decodes to 33 bytes, not 32"),
        ({"extra": 1}, "exactly the keys"),
        ({"n": True}, "whole number"),
    ],
)
def test_a_broken_typed_array_is_one_error_naming_where(change: dict[str, Any], problem: str) -> None:
    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 2))
    with pytest.raises(qinsight.errors.ReportFileError, match=problem) as info:
        report_from_json(_with_first_array(report, change), source="r.json")
    assert info.value.location is not None and info.value.location.startswith("$.")


@pytest.mark.parametrize(("suffix", "squeeze"), [(".gz", lambda b: gzip.compress(b, mtime=0)), (".xz", lzma.compress)])
def test_a_broken_or_explosive_stream_is_one_error_in_bounded_memory(suffix: str, squeeze: Any, tmp_path: Path) -> None:
    report = qinsight.diagnose(seeded(MLP()), gaussian_batches((8, 16), 2))
    good = tmp_path / f"r.json{suffix}"
    qinsight.save_report(report, good)
    cut = tmp_path / f"cut.json{suffix}"
    cut.write_bytes(good.read_bytes()[:-20])
    with pytest.raises(qinsight.errors.ReportFileError, match="cut short|does not decompress"):
        qinsight.load_report(cut)
    bomb = tmp_path / f"bomb.json{suffix}"
    bomb.write_bytes(squeeze(b" " * (64 * 2**20)))  # 64 MiB of spaces in a few KiB
    tracemalloc.start()
    try:
        with pytest.raises(qinsight.errors.ReportFileError, match="decompresses to more than the 1048576-byte limit"):
            qinsight.load_report(bomb, max_bytes=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, peak  # the limit, and xz's dictionary (8 MiB at the default preset)
    garbage = tmp_path / f"garbage.json{suffix}"
    garbage.write_bytes(good.read_bytes()[:6] + os.urandom(200))
    with pytest.raises(qinsight.errors.ReportFileError, match="gzip|xz"):
        qinsight.load_report(garbage)


# -- the file's compact forms: references to arrays met before, deflated byte planes (schema 3.0)

_KINDS = ["f4", "f8", "u1", "u2", "i4", "i8"]


@st.composite
def _array_trees(draw: st.DrawFn) -> tuple[Any, list[tuple[str, tuple[Any, ...]]]]:
    """A JSON tree holding typed arrays (some repeated, some of one value: they deflate), and its arrays."""
    pool: list[tuple[str, tuple[Any, ...]]] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(_KINDS))
        size = draw(st.integers(SHORTEST, 64))
        if kind[0] == "f":
            element = st.floats(width=32) if kind == "f4" else st.floats()
            values: tuple[Any, ...] = tuple(
                draw(st.one_of(st.lists(element, min_size=size, max_size=size), st.just([1.5] * size)))
            )
        else:
            info = {"u1": (0, 255), "u2": (0, 65535), "i4": (-(2**31), 2**31 - 1), "i8": (-(2**63), 2**63 - 1)}[kind]
            values = tuple(draw(st.lists(st.integers(*info), min_size=size, max_size=size)))
        pool.append((kind, values))
    order = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=8))
    tree = {
        "a": [{"x": _raw(kind, values), "y": 1} for kind, values in order[::2]],
        "b": {"z": [_raw(k, v) for k, v in order[1::2]]},
    }
    return tree, order[::2] + order[1::2]


def _raw(kind: str, values: tuple[Any, ...]) -> dict[str, Any]:
    import numpy as np

    dtype = {"f4": "<f4", "f8": "<f8", "u1": "<u1", "u2": "<u2", "i4": "<i4", "i8": "<i8"}[kind]
    return {
        "array": kind,
        "n": len(values),
        "base64": base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode("ascii"),
    }


@settings(max_examples=examples(200), deadline=None)
@given(drawn=_array_trees())
def test_compacted_arrays_come_back_bit_for_bit_and_repeats_share_one_tuple(
    drawn: tuple[Any, list[tuple[str, tuple[Any, ...]]]],
) -> None:
    from qinsight.outputs.arrays import Decoded, compacted, expanded

    tree, arrays = drawn
    text = json.dumps(compacted(json.loads(json.dumps(tree))))
    keys = [(kind, _raw(kind, values)["base64"]) for kind, values in arrays]  # type and bytes: -0.0 is not 0.0
    assert text.count('"same"') == len(keys) - len(set(keys))  # each repeat a reference, the first its values
    back = expanded(json.loads(text), max_bytes=2**20)
    decoded = [entry["x"] for entry in back["a"]] + back["b"]["z"]
    assert all(isinstance(d, Decoded) for d in decoded)
    for (kind, values), array in zip(arrays, decoded):
        if kind[0] == "f":
            assert same_floats(floats_in(array), values)
        else:
            assert ints_in(array) == values
    firsts: dict[tuple[str, str], Any] = {}
    for key, array in zip(keys, decoded):
        assert firsts.setdefault(key, array) is array  # a repeat is the same object: no copy


def test_a_real_reports_file_references_its_repeats_and_deflates_its_arrays(tmp_path: Path) -> None:
    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 3))
    path = tmp_path / "r.json"
    qinsight.save_report(report, path)
    text = path.read_text()
    assert (
        '"same": ' in text and '"deflate": ' in text and json.loads(text)["schema_version"][0] >= 3
    )  # the forms of schema 3, which 4.0 keeps
    assert qinsight.load_report(path) == report
    standalone = json.dumps(report_to_dict(report), indent=1)  # schema 2's form, which 3.0 readers read too
    assert len(text) < 0.75 * len(standalone)
    assert report_from_json(standalone) == report


def _compact_file(report: qinsight.Report, change: Any) -> str:
    from qinsight.outputs.arrays import compacted

    data = compacted(report_to_dict(report))
    forms: list[dict[str, Any]] = []

    def visit(value: Any) -> None:
        if isinstance(value, dict) and "array" in value:
            forms.append(value)
        for child in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            visit(child)

    visit(data)
    change(forms)
    return json.dumps(data)


def _first(forms: list[dict[str, Any]], form: str) -> dict[str, Any]:
    return next(f for f in forms if form in f)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda forms: _first(forms, "same").update(same=10**6), "names one of the .* arrays before it, not 1000000"),
        (lambda forms: _first(forms, "same").update(same=-1), "before it, not -1"),
        (
            lambda forms: (forms[0].clear(), forms[0].update(array="f4", n=16, same=0)),
            "names one of the 0 arrays before it",
        ),  # itself
        (lambda forms: _first(forms, "same").update(n=_first(forms, "same")["n"] + 1), "refers to one of"),
        (lambda forms: _first(forms, "deflate").update(deflate="eJw="), "does not inflate|inflates to other than"),
        (
            lambda forms: _first(forms, "deflate").update(
                deflate=base64.b64encode(__import__("zlib").compress(b"\0" * 8)).decode()
            ),
            "inflates to other than",
        ),
        (lambda forms: _first(forms, "deflate").update(deflate="!!"), "deflate does not decode"),
    ],
)
def test_a_broken_reference_or_deflated_array_is_one_error_naming_where(change: Any, problem: str) -> None:
    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 2))
    with pytest.raises(qinsight.errors.ReportFileError, match=problem) as info:
        report_from_json(_compact_file(report, change), source="r.json")
    assert info.value.location is not None and info.value.location.startswith("$.")


def test_deflated_arrays_inflate_within_the_limit_and_references_cost_nothing(tmp_path: Path) -> None:
    import zlib

    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 2))
    bomb = 2**27  # 128 MiB of zeros claimed by one array of a file of a few hundred KiB
    change = lambda forms: _first(forms, "deflate").update(  # noqa: E731
        array="u1", n=bomb, deflate=base64.b64encode(zlib.compress(b"\0" * bomb, 9)).decode()
    )
    path = tmp_path / "bomb.json"
    path.write_text(_compact_file(report, change))
    tracemalloc.start()
    try:
        with pytest.raises(qinsight.errors.ReportFileError, match="decode to more than the 4194304-byte limit"):
            qinsight.load_report(path, max_bytes=4 * 2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    # 100,000 references to one array of 4,096 values: they share its one tuple
    many = {"array": "f8", "n": 4096, "same": 0}
    data = {"first": _raw("f8", tuple(float(i) for i in range(4096))), "refs": [dict(many) for _ in range(100_000)]}
    from qinsight.outputs.arrays import expanded

    tracemalloc.start()
    try:
        back = expanded(json.loads(json.dumps(data)), max_bytes=2**20)
        values = [floats_in(ref) for ref in back["refs"]]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len({id(v) for v in values}) == 1 and len(values[0]) == 4096
    assert peak < 100 * 2**20, peak  # the parsed JSON (about 50 MB); 100,000 copies would be 13 GB


@settings(max_examples=examples(200), deadline=None)
@given(values=st.lists(st.sampled_from(list(ChannelStatus)), max_size=70))
def test_a_tuple_of_enum_members_comes_back_as_its_levels_and_codes(values: list[Any]) -> None:
    from qinsight.outputs.arrays import compacted, enums_in, enums_out, expanded

    packed = enums_out(tuple(values))
    if len(values) < SHORTEST:
        assert packed is None
        return
    assert packed is not None and packed["levels"] == list(dict.fromkeys(v.value for v in values))
    back = expanded(json.loads(json.dumps(compacted({"statuses": packed}))), max_bytes=2**20)["statuses"]
    assert enums_in(back, ChannelStatus) == tuple(values)


def test_a_real_reports_channel_statuses_are_levels_and_codes(tmp_path: Path) -> None:
    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 3))
    path = tmp_path / "r.json"
    qinsight.save_report(report, path)
    assert '"array": "enum"' in path.read_text() and '"levels": [' in path.read_text()
    assert qinsight.load_report(path) == report


def _with_first_enum(report: qinsight.Report, change: Any) -> str:
    data = report_to_dict(report)
    found: list[dict[str, Any]] = []

    def visit(value: Any) -> None:
        if isinstance(value, dict) and value.get("array") == "enum":
            found.append(value)
        for child in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            visit(child)

    visit(data)
    change(found[0])
    return json.dumps(data)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda e: e["levels"].__setitem__(0, "sideways"), "levels among .*'ok'.*not \\['sideways'"),
        (lambda e: e.update(levels=[*e["levels"], e["levels"][0]]), "distinct levels"),
        (lambda e: e.update(n=e["n"] + 1), "n codes"),
        (lambda e: e.update(levels=[]), "indices into its 0 levels"),
        (lambda e: e.pop("levels"), "an object with the keys"),
        (lambda e: e.update(codes=[0] * e["n"]), "n codes, a typed array"),
    ],
)
def test_a_broken_enum_array_is_one_error_naming_where(change: Any, problem: str) -> None:
    report = qinsight.diagnose(seeded(MLP((64, 128, 128, 16))), gaussian_batches((8, 64), 2))
    with pytest.raises(qinsight.errors.ReportFileError, match=problem) as info:
        report_from_json(_with_first_enum(report, change), source="r.json")
    assert info.value.location is not None and "statuses" in info.value.location
