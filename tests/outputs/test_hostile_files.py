"""Report files written to hurt: each gives one ReportFileError naming the file and the JSON path, in
memory bounded by a small multiple of the file, or loads as a valid report. Nothing else escapes."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import tracemalloc
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from _checks import examples, json_paths
from _data import gaussian_batches
from _models import MLP, seeded
from _peers import quantized_fx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qinsight
from qinsight.core import entry_points
from qinsight.outputs.arrays import compacted
from qinsight.outputs.serde import load_report, report_from_json, report_to_dict


@cache
@functools.cache
def _real_report() -> qinsight.Report:
    """A diagnosis of a small MLP by every built-in detector, with a comparison: every section filled."""
    model = seeded(MLP())
    data = gaussian_batches((8, 16), 3)
    _, quantized = quantized_fx(model, data)
    comparison = qinsight.Comparison(
        quantized="convert_fx",
        weights=qinsight.compare_weights(model, quantized),
        activations=qinsight.compare_activations(model, quantized, data),
    )
    return qinsight.diagnose(model, data, model_name="mlp").with_comparison(comparison)


def real_report(*, packed: bool = False, compact: bool = False) -> dict[str, Any]:
    """That report as its file's JSON value: arrays as lists, or (``packed``) long ones typed binary, and
    (``compact``) those as the file holds them: repeats referenced, byte planes deflated."""
    data = report_to_dict(_real_report(), packed=packed)
    return compacted(data) if compact else data


def replaced(data: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(data) if isinstance(data, dict) else list(data)
    copy[path[0]] = replaced(data[path[0]], path[1:], new)
    return copy


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
HOSTILE_VALUES = st.sampled_from(
    [
        [[]] * 20_000,  # a huge list of wrong elements
        [{}] * 20_000,
        ["x"] * 20_000,
        -1,
        2**70,
        "nan",
        "inf",
        "\x1b[31mred\x1b[0m\x07",
        {"type": "PerChannelFinding"},
    ]
)
TOKENS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "9" * 5000, "[" * 5000, "\x00"])


@st.composite
def mutated(draw: st.DrawFn) -> str:
    form = draw(st.sampled_from(["lists", "typed", "compact"]))
    data = real_report(packed=form != "lists", compact=form == "compact")
    path = draw(st.sampled_from(json_paths(data)))
    how = draw(st.sampled_from(["value", "hostile", "delete", "token", "truncate", "duplicate"]))
    if how == "value":
        return json.dumps(replaced(data, path, draw(JSON_VALUES)))
    if how == "hostile":
        return json.dumps(replaced(data, path, draw(HOSTILE_VALUES)))
    if how == "delete" and path:
        parent = _get(data, path[:-1])
        if isinstance(parent, dict):
            return json.dumps(replaced(data, path[:-1], {k: v for k, v in parent.items() if k != path[-1]}))
        return json.dumps(replaced(data, path[:-1], [v for i, v in enumerate(parent) if i != path[-1]]))
    if how == "duplicate" and path and isinstance(_get(data, path[:-1]), list):
        parent = _get(data, path[:-1])
        return json.dumps(replaced(data, path[:-1], parent + parent))
    text = json.dumps(replaced(data, path, "@@TOKEN@@"))
    if how == "token":
        return text.replace('"@@TOKEN@@"', draw(TOKENS))
    return json.dumps(data)[: draw(st.integers(0, len(json.dumps(data))))]


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


@settings(
    max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(text=mutated())
def test_mutated_report_files_give_one_clear_error_or_a_valid_report(
    text: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "r.json"
    path.write_text(text, encoding="utf-8")
    tracemalloc.start()
    try:
        report = load_report(path)
    except qinsight.errors.ReportFileError as exc:
        assert exc.source == str(path) and str(exc).startswith(f"{path}: ") and "\n" not in exc.problem
        report = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 40 * len(text) + 4_000_000, f"{peak} bytes to read {len(text)}"
    if report is not None:  # what loads is a report that writes back as the same file
        written = json.dumps(report_to_dict(report))
        assert json.dumps(report_to_dict(report_from_json(written))) == written


def test_a_key_with_a_newline_is_quoted_on_the_errors_one_line(tmp_path: Path) -> None:
    # found by the test above: a typed array's error listed its keys verbatim, a newline in one included
    data = real_report(packed=True)
    array = next(p for p in json_paths(data) if isinstance(_get(data, p), dict) and "array" in _get(data, p))
    path = tmp_path / "r.json"
    path.write_text(json.dumps(replaced(data, array, {**_get(data, array), "evil\nkey": 1})))
    with pytest.raises(qinsight.errors.ReportFileError) as caught:
        load_report(path)
    assert "\n" not in str(caught.value) and "'evil\\nkey'" in caught.value.problem


BAD_VALUES = {
    "a NaN token": (lambda d: json.dumps(d).replace('"batches": 3', '"batches": NaN', 1), "NaN is not JSON", None),
    "an overflowing number": (
        lambda d: json.dumps(d).replace('"batches": 3', '"batches": 1e400', 1),
        "does not fit a float",
        None,
    ),
    "a huge integer": (
        lambda d: json.dumps(d).replace('"batches": 3', '"batches": ' + "9" * 5000, 1),
        "not valid JSON",
        None,
    ),
    "a negative count": (
        lambda d: json.dumps({**d, "metadata": {**d["metadata"], "batches": -2}}),
        "'batches' must be >= 0: -2",
        "$.metadata",
    ),
    "a duplicate site": (
        lambda d: json.dumps({**d, "sites": d["sites"] + d["sites"][:1]}),
        "each site may appear once; repeated: fc1",
        "$",
    ),
    "channels of two lengths": (
        lambda d: json.dumps(
            replaced(d, ("observations", 0, "stats", "channel_max"), d["observations"][0]["stats"]["channel_max"][:-1])
        ),
        "one value per channel",
        "$.observations[0].stats",
    ),
    "a bad finding": (
        lambda d: json.dumps(replaced(d, ("results", 0, "findings", 1, "kind"), "conv9d")),
        "'conv9d' is not a valid OpKind",
        "$.results[0].findings[1].kind",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_VALUES))
def test_invalid_values_are_one_error_with_the_path(kind: str, tmp_path: Path) -> None:
    make, problem, location = BAD_VALUES[kind]
    path = tmp_path / "r.json"
    path.write_text(make(real_report()))
    with pytest.raises(qinsight.errors.ReportFileError) as info:
        load_report(path)
    assert problem in info.value.problem and info.value.source == str(path)
    assert info.value.location == location


def peak_rss_of_show(path: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in bytes) of `qinsight show path` in a fresh process."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent (pytest, with torch loaded)
    probe = (
        "import re, sys; from qinsight.cli import main; code = main(['show', sys.argv[1]]); "
        "status = open('/proc/self/status').read(); "
        "print(int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)) * 1024, file=sys.stderr); sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=600)
    *lines, peak = result.stderr.strip().splitlines()
    return result.returncode, "\n".join(lines), int(peak)


def test_a_small_file_of_many_bad_elements_reads_in_bounded_memory(tmp_path: Path) -> None:
    # 500,000 `[]` sites in 1.5 MB took 2.9 GB and 56 s: cattrs kept an exception per bad element.
    path = tmp_path / "amplify.json"
    path.write_text(json.dumps({**real_report(), "sites": [[]] * 500_000}, separators=(",", ":")))
    assert 1_000_000 < path.stat().st_size < 2_000_000
    code, stderr, peak = peak_rss_of_show(path)
    assert (
        code == 2
        and stderr == f"qinsight: error: {path}: invalid OpSite: 'list' object has no attribute 'keys' @ $.sites[0]"
    )
    assert peak < 200 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB"


def test_reads_are_capped_for_devices_and_pipes() -> None:
    with pytest.raises(qinsight.errors.ReportFileError, match="/dev/zero: larger than the 1000-byte limit"):
        load_report("/dev/zero", max_bytes=1000)
    piped = subprocess.run(
        f'yes | {sys.executable} -c \'from qinsight.outputs.serde import load_report; load_report("/dev/stdin", '
        "max_bytes=10**6)'",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "ReportFileError: /dev/stdin: larger than the 1000000-byte limit" in piped.stderr


def test_results_of_one_unknown_detector_scan_the_installed_plugins_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = real_report()
    raw = {
        "detector": "acme.gone",
        "parameters": [],
        "findings": [{"fqn": "fc1", "type": "GoneFinding", "summary": {"verdict": "x"}}],
        "suggestions": [],
    }
    results = [{**raw, "detector": f"acme.gone{i}"} for i in range(200)]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**data, "results": data["results"] + results}))
    scans = []
    scan = entry_points.scan_entry_points
    monkeypatch.setattr(entry_points, "scan_entry_points", lambda group: scans.append(group) or scan(group))
    entry_points._SCANS.clear()
    report = load_report(path)
    assert len(report.results) == len(data["results"]) + 200 and scans == ["qinsight.detectors"]
    assert report.result("acme.gone7").findings[0].verdict == "x"


def test_non_finite_values_are_written_as_strings_and_read_back(tmp_path: Path) -> None:
    data = real_report()
    stats = data["observations"][0]["stats"]
    assert isinstance(stats["min"], float) and math.isfinite(stats["min"])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(replaced(data, ("observations", 0, "stats", "min"), "-inf")))
    assert load_report(path).observations[0].stats.min == -math.inf
