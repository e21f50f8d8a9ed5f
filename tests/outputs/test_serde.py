"""Report files: round trips (hypothesis and real reports), bad files, versions, the schema
snapshot, and plugin findings that survive a reader without the plugin."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from _checks import examples
from _data import gaussian_batches
from _models import MLP, seeded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qinsight
from qinsight.core.comparison import LayerActivationComparison, LayerParity, LoweredComparison, MetricValue, ProgramCost
from qinsight.core.plan import STAGES
from qinsight.core.report import ReportMetadata
from qinsight.core.sites import OpSite
from qinsight.core.stats import ActivationStats, BatchMoments, FormatError, PercentileStats, TailStats
from qinsight.examples import example
from qinsight.outputs.schema import compatibility, schema
from qinsight.outputs.serde import (
    FORMAT,
    SCHEMA_VERSION,
    STRICT,
    RawFinding,
    ReportFileError,
    ReportVersionError,
    load_report,
    report_from_json,
    report_to_dict,
    report_to_json,
    save_report,
)
from qinsight.plugin.testing import write_distribution

from _plugin_sources import WIDTHS

# Values the classes accept: counts are >= 0 and per-channel tuples have one entry per channel, which
# their validators check; hypothesis cannot read validators, so the valid values are spelled out.
COUNTS = st.integers(min_value=0, max_value=2**40)
FLOATS = st.floats(allow_nan=False)


def _percentiles(channels: int) -> st.SearchStrategy[PercentileStats]:
    return st.builds(
        PercentileStats,
        percentile=FLOATS,
        ratio_sum=st.tuples(*[FLOATS] * channels),
        measured_batches=st.tuples(*[COUNTS] * channels),
        constant_batches=st.tuples(*[COUNTS] * channels),
    )


def _tails(channels: int) -> st.SearchStrategy[TailStats]:
    return st.builds(
        TailStats,
        values=COUNTS,
        abs_sum=st.tuples(*[FLOATS] * channels),
        above=st.tuples(*[COUNTS] * channels),
        tokens=COUNTS,
        massive_tokens=COUNTS,
        massive_hits=st.tuples(*[COUNTS] * channels),
        power_sums=st.tuples(FLOATS, FLOATS, FLOATS, FLOATS),
    )


def _activation_stats(channels: int) -> st.SearchStrategy[ActivationStats]:
    per_channel = st.tuples(*[FLOATS] * channels)
    return st.builds(
        ActivationStats,
        spec=st.from_type(qinsight.types.ObserverSpec),
        batches=COUNTS,
        nonfinite_batches=COUNTS,
        constant_batches=COUNTS,
        channel_min=per_channel,
        channel_max=per_channel,
        moments=st.none() | st.from_type(BatchMoments),
        percentiles=st.lists(_percentiles(channels), max_size=2).map(tuple),
        tails=st.none() | _tails(channels),
        formats=st.lists(
            st.builds(FormatError, format=st.sampled_from(("int8", "int4_g32")), sqnr=FLOATS), max_size=2
        ).map(tuple),
    )


for _cls in (
    BatchMoments,
    PercentileStats,
    TailStats,
    ActivationStats,
    OpSite,
    ReportMetadata,
    LayerActivationComparison,
    MetricValue,
    ProgramCost,
    LayerParity,
    LoweredComparison,
):
    attrs.resolve_types(_cls)  # string annotations (from __future__), which builds() must see as types
st.register_type_strategy(BatchMoments, st.builds(BatchMoments, count=COUNTS))
st.register_type_strategy(PercentileStats, st.integers(0, 4).flatmap(_percentiles))
st.register_type_strategy(TailStats, st.integers(0, 4).flatmap(_tails))
st.register_type_strategy(ActivationStats, st.integers(0, 4).flatmap(_activation_stats))
st.register_type_strategy(
    qinsight.types.OpCall, st.builds(qinsight.types.OpCall, owner=st.text(), target=st.text(), index=COUNTS)
)
st.register_type_strategy(OpSite, st.builds(OpSite, calls=COUNTS, groups=st.integers(1, 2**20)))
st.register_type_strategy(ReportMetadata, st.builds(ReportMetadata, batches=COUNTS))
METRIC_VALUES = st.lists(st.builds(MetricValue, value=FLOATS, higher_is_better=st.booleans()), max_size=3).map(tuple)
st.register_type_strategy(
    LayerActivationComparison,
    st.builds(LayerActivationComparison, batches=COUNTS, propagated=METRIC_VALUES, local=METRIC_VALUES),
)
st.register_type_strategy(ProgramCost, st.builds(ProgramCost, latency_ms=FLOATS, size_bytes=COUNTS))
st.register_type_strategy(
    LayerParity,
    st.builds(
        LayerParity,
        sqnr=FLOATS,
        propagated=FLOATS,
        max_abs=FLOATS,
        step=st.none() | FLOATS,
        mismatched=FLOATS,
        batches=COUNTS,
    ),
)
st.register_type_strategy(
    LoweredComparison,
    st.builds(
        LoweredComparison,
        batches=COUNTS,
        lowered_vs_reference=METRIC_VALUES,
        lowered_vs_float=METRIC_VALUES,
        reference_vs_float=METRIC_VALUES,
        layers=st.lists(st.from_type(LayerParity), max_size=2).map(tuple),
    ),
)

# plan scores: finite here (a NaN scalar never compares equal); test_plan saves NaN scores in a file
SCORES = st.floats(-1e6, 1e6)
FRACTIONS = st.floats(0.0, 1.0)
for _cls in (
    qinsight.types.PlanStep,
    qinsight.types.SuggestionCheck,
    qinsight.types.SiteSensitivity,
    qinsight.types.Target,
    qinsight.types.Budget,
    qinsight.types.SearchedOrder,
    qinsight.QuantPlan,
    qinsight.types.SmoothingEntry,
    qinsight.SmoothingMapping,
    qinsight.types.BiasShift,
    qinsight.BiasCorrection,
):
    attrs.resolve_types(_cls)
st.register_type_strategy(
    qinsight.types.PlanStep,
    st.builds(qinsight.types.PlanStep, score=SCORES, quantized_fraction=FRACTIONS, stage=st.sampled_from(STAGES)),
)
st.register_type_strategy(
    qinsight.types.SuggestionCheck,
    st.builds(qinsight.types.SuggestionCheck, before=SCORES, alone=SCORES, together=SCORES, without=SCORES),
)
st.register_type_strategy(
    qinsight.types.SiteSensitivity,
    st.builds(qinsight.types.SiteSensitivity, parameters=COUNTS, float_only=SCORES, quantized_only=SCORES, gain=SCORES),
)
st.register_type_strategy(qinsight.types.Target, st.builds(qinsight.types.Target, threshold=st.floats(-1e6, 1e6)))
st.register_type_strategy(
    qinsight.types.SearchedOrder,
    st.builds(qinsight.types.SearchedOrder, quantized_fraction=FRACTIONS, score=SCORES),
)
st.register_type_strategy(
    qinsight.types.Budget,
    st.builds(qinsight.types.Budget, unit=st.sampled_from(["float", "bits"]), limit=st.floats(0, 1e6)),
)
st.register_type_strategy(
    qinsight.types.SmoothingEntry,
    st.builds(
        qinsight.types.SmoothingEntry,
        alpha=FRACTIONS,
        factors=st.lists(st.floats(1e-6, 1e6), min_size=1, max_size=4).map(tuple),
        sqnr_before=SCORES,
        sqnr_after=SCORES,
    ),
)
st.register_type_strategy(
    qinsight.SmoothingMapping,
    st.lists(st.from_type(qinsight.types.SmoothingEntry), max_size=2, unique_by=lambda e: e.fqn).map(
        lambda entries: qinsight.SmoothingMapping(entries=tuple(entries))
    ),
)
st.register_type_strategy(
    qinsight.types.BiasShift,
    st.builds(
        qinsight.types.BiasShift,
        shift=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40).map(tuple),  # long ones as typed arrays
        size=st.floats(0, 1e6),
    ),
)
st.register_type_strategy(
    qinsight.BiasCorrection,
    st.lists(st.from_type(qinsight.types.BiasShift), max_size=2, unique_by=lambda e: e.into).map(
        lambda entries: qinsight.BiasCorrection(entries=tuple(entries))
    ),
)
st.register_type_strategy(
    qinsight.QuantPlan,
    st.builds(
        qinsight.QuantPlan,
        default_score=SCORES,
        verified_score=SCORES,
        held_out_score=SCORES,
        quantized_fraction=FRACTIONS,
        agreement=SCORES,
        evaluations=COUNTS,
        steps=st.lists(st.from_type(qinsight.types.PlanStep), max_size=3).map(tuple),
        orders=st.lists(st.from_type(qinsight.types.SearchedOrder), max_size=2).map(tuple),
        checks=st.lists(st.from_type(qinsight.types.SuggestionCheck), max_size=2).map(tuple),
        sensitivities=st.lists(st.from_type(qinsight.types.SiteSensitivity), max_size=2).map(tuple),
        sites=st.lists(st.from_type(OpSite), max_size=2).map(tuple),
        smoothing=st.from_type(qinsight.SmoothingMapping),
    ),
)

# a format plan's points and layers: counts never negative, held-out scores drawn (their default is NaN)
for _cls in (
    qinsight.types.CurvePoint,
    qinsight.types.LayerFormat,
    qinsight.FormatPlan,
    qinsight.types.OrderCheck,
    qinsight.types.FormatCost,
):
    attrs.resolve_types(_cls)
st.register_type_strategy(
    qinsight.types.CurvePoint,
    st.builds(
        qinsight.types.CurvePoint, mean_bits=SCORES, state_bytes=COUNTS, score=SCORES, held_out=SCORES, bound=SCORES
    ),
)
st.register_type_strategy(
    qinsight.types.LayerFormat, st.builds(qinsight.types.LayerFormat, parameters=COUNTS, bits=SCORES)
)
st.register_type_strategy(qinsight.types.FormatCost, st.builds(qinsight.types.FormatCost, damage=SCORES, score=SCORES))
st.register_type_strategy(
    qinsight.FormatPlan,
    st.builds(
        qinsight.FormatPlan,
        evaluations=COUNTS,
        float_score=SCORES,
        uniform=st.lists(st.from_type(qinsight.types.CurvePoint), max_size=2).map(tuple),
        curve=st.lists(st.from_type(qinsight.types.CurvePoint), max_size=2).map(tuple),
        costs=st.lists(st.from_type(qinsight.types.FormatCost), max_size=2).map(tuple),
        orders=st.lists(st.from_type(qinsight.types.OrderCheck), max_size=2).map(tuple),
    ),
)

# a verification's scores: -inf is a config the flow cannot run, so infinities are drawn; NaN (its
# default) never equals itself
VERIFIED_SCORES = st.floats(allow_nan=False)
for _cls in (qinsight.types.KindCheck, qinsight.types.ConfigVerification):
    attrs.resolve_types(_cls)
st.register_type_strategy(
    qinsight.types.KindCheck, st.builds(qinsight.types.KindCheck, modules=COUNTS, without=VERIFIED_SCORES)
)
st.register_type_strategy(
    qinsight.types.ConfigVerification,
    st.builds(
        qinsight.types.ConfigVerification,
        default=VERIFIED_SCORES,
        suggested=VERIFIED_SCORES,
        score=VERIFIED_SCORES,
        calibrated=COUNTS,
        scored=COUNTS,
        checks=st.lists(st.from_type(qinsight.types.KindCheck), max_size=3).map(tuple),
    ),
)
SECONDS = st.floats(min_value=0.0, allow_infinity=False)
st.register_type_strategy(
    qinsight.types.StageTime,
    st.builds(qinsight.types.StageTime, stage=st.text(), seconds=SECONDS, real_configs=COUNTS, real_seconds=SECONDS),
)
st.register_type_strategy(
    qinsight.types.PlanCost,
    st.builds(
        qinsight.types.PlanCost,
        stages=st.lists(st.from_type(qinsight.types.StageTime), max_size=3).map(tuple),
        simulated_forwards=SECONDS,
    ),
)

st.register_type_strategy(
    qinsight.types.SpeedBound,
    st.builds(qinsight.types.SpeedBound, measure=st.sampled_from(("speedup", "latency")), limit=st.floats(0.01, 1e6)),
)

SNAPSHOT = Path(__file__).parent.parent / "data" / "report_schema.json"

# attrs compares fields with ==, and NaN != NaN: a NaN in a scalar field never compares equal.
# Reports hold NaN only inside per-channel tuples (unmeasurable channels), where tuple equality
# sees the same math.nan object the file format loads; so scalars are drawn without NaN here,
# and test_nan_inside_tuples_round_trips covers the tuples.
st.register_type_strategy(float, st.floats(allow_nan=False))
st.register_type_strategy(
    qinsight.types.ObserverSpec,  # its invariants: sorted percentiles in (0, 1), which imply per_channel
    st.builds(
        qinsight.types.ObserverSpec,
        channel_axis=st.integers(-4, 4),
        per_channel=st.booleans(),
        moments=st.booleans(),
        formats=st.lists(st.sampled_from(("int8", "float8", "int4_g32", "int4_g128")), unique=True).map(
            lambda fs: tuple(sorted(fs))
        ),
    )
    | st.builds(
        qinsight.types.ObserverSpec,
        channel_axis=st.integers(-4, 4),
        per_channel=st.just(True),
        moments=st.booleans(),
        percentiles=st.lists(st.floats(0.01, 0.99), unique=True, max_size=3).map(lambda ps: tuple(sorted(ps))),
        percentile_samples=st.none() | st.integers(1, 10**6),
    ),
)
st.register_type_strategy(
    qinsight.types.NarrowedInput, st.builds(qinsight.types.NarrowedInput, fqn=st.text(), excess=st.floats(0.0, 1e9))
)
st.register_type_strategy(
    qinsight.types.FxActivations,
    st.builds(
        qinsight.types.FxActivations,
        bits=st.sampled_from((7, 8)),
        narrowed=st.lists(st.from_type(qinsight.types.NarrowedInput), max_size=2).map(tuple),
        kernels=st.integers(0, 1000),
    ),
)
st.register_type_strategy(
    qinsight.types.Parameter,
    st.builds(
        qinsight.types.Parameter,
        name=st.text(),
        value=st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text()),
    ),
)


def all_classes() -> list[type]:
    names = set(schema()["classes"])
    found: dict[str, type] = {}
    for module in (
        "qinsight.types",
        "qinsight.detectors",
        "qinsight.core.plan",
        "qinsight.core.fx_activations",
        "qinsight.detectors.dynamic_static",
        "qinsight.core.precision",
        "qinsight.core.stats",
        "qinsight.core.suggestions",
        "qinsight.core.report",
        "qinsight.core.equalization",
        "qinsight.core.comparison",
    ):
        mod = importlib.import_module(module)
        for name in sorted(names):  # the same order in every run: parametrized ids do not follow set order
            if hasattr(mod, name):
                found[name] = getattr(mod, name)
    assert set(found) == names
    return [
        cls
        for cls in found.values()
        if attrs.has(cls) and cls not in (qinsight.Report, qinsight.types.DetectorResult, qinsight.types.Finding)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("cls", all_classes(), ids=lambda c: c.__name__)
@settings(
    max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_every_class_round_trips(cls: type, data: st.DataObject) -> None:
    value = data.draw(st.from_type(cls))
    text = json.dumps(STRICT.unstructure(value), allow_nan=False)
    assert STRICT.structure(json.loads(text), cls) == value


def test_nan_inside_tuples_round_trips() -> None:
    finding = qinsight.detectors.EqualizationFinding(
        fqn="fc",
        kind=qinsight.types.OpKind.LINEAR,
        ratio_threshold=0.5,
        channel_fraction=0.4,
        condition=qinsight.types.DataCondition.OK,
        input_ranges=(0.0, 1.0),
        weight_ranges=(1.0, math.inf),
        scores=(math.nan, 2.5),
        recommended_channels=(1,),
    )
    text = json.dumps(STRICT.unstructure(finding), allow_nan=False)
    assert '"nan"' in text and '"inf"' in text
    assert STRICT.structure(json.loads(text), qinsight.detectors.EqualizationFinding) == finding


def test_non_finite_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="must be finite"):
        qinsight.types.Parameter(name="t", value=math.inf)


@pytest.fixture(scope="module")
def reports() -> list[qinsight.Report]:
    out = []
    for name in ("cnn", "encoder"):
        chosen = example(name)
        # the cnn's verified for real: its dropped equalization (a -inf-free verdict) round-trips too
        out.append(qinsight.diagnose(chosen.model(), chosen.data(3), model_name=name, verify=name == "cnn"))
    data = gaussian_batches((4, 16), 3)
    data[1][0, 0] = float("nan")  # a NaN batch, an all-NaN-free report with inf stats below
    # NaN batches: the statistics' inf and NaN round-trip; unverified (a failed verification's NaN
    # scores would make the reports unequal to themselves under ==)
    out.append(qinsight.diagnose(seeded(MLP()), data, verify=False))
    out.append(qinsight.diagnose(seeded(MLP()), [gaussian_batches((2, 16), 1)[0] * math.nan], verify=False))
    return out


def test_real_reports_round_trip(reports: list[qinsight.Report], tmp_path: Path) -> None:
    for index, report in enumerate(reports):
        path = tmp_path / f"r{index}.json"
        qinsight.save_report(report, path)
        assert qinsight.load_report(path) == report == qinsight.load_report(path)
    assert any(f.verdict == "no calibration data" for f in reports[-1].actionable())
    assert reports[0].verification and reports[0].verification[0].checks


def test_files_are_strict_json_with_non_finite_floats(reports: list[qinsight.Report]) -> None:
    text = report_to_json(reports[-1])  # statistics of no data: min = inf, max = -inf

    def refuse(token: str) -> float:
        raise AssertionError(f"non-standard JSON token {token}")

    data = json.loads(text, parse_constant=refuse)
    assert data["format"] == FORMAT and data["schema_version"] == list(SCHEMA_VERSION)
    assert data["observations"][0]["stats"]["min"] == "inf"
    assert {"metadata", "sites", "observations", "results", "suggestions", "equalization_mapping", "failures"} <= set(
        data
    )
    finding = data["results"][0]["findings"][0]
    assert set(finding["summary"]) == {"verdict", "actionable", "reason"} and finding["type"] == "PerChannelFinding"


def write(tmp_path: Path, content: str | bytes, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def good_dict(reports: list[qinsight.Report]) -> dict[str, Any]:
    return report_to_dict(reports[2])


BAD: dict[str, tuple[Any, str, str | None]] = {
    "truncated": (lambda d: json.dumps(d)[:200], "not valid JSON: ", None),
    "not_json": (lambda d: "report: yes\n", "not valid JSON: Expecting value at line 1, column 1", None),
    "top_level_list": (lambda d: "[1, 2]", "the top level is list, not a JSON object", "$"),
    "wrong_format": (
        lambda d: json.dumps({**d, "format": "onnx"}),
        "not a qinsight report: format is 'onnx'",
        "$.format",
    ),
    "bad_version": (
        lambda d: json.dumps({**d, "schema_version": "1.0"}),
        "schema_version must be [major, minor]",
        "$.schema_version",
    ),
    "wrong_type": (
        lambda d: json.dumps({**d, "metadata": {**d["metadata"], "batches": "three"}}),
        "expected int, not str 'three'",
        "$.metadata.batches",
    ),
    "missing_field": (
        lambda d: json.dumps({**d, "metadata": {k: v for k, v in d["metadata"].items() if k != "model"}}),
        "required field missing",
        "$.metadata.model",
    ),
    "extra_field": (lambda d: json.dumps({**d, "comment": "hi"}), "extra fields found (comment)", "$"),
    "bad_enum": (
        lambda d: json.dumps({**d, "sites": [{**d["sites"][0], "kind": "conv9d"}]}),
        "'conv9d' is not a valid OpKind",
        "$.sites[0].kind",
    ),
    "bad_float": (
        lambda d: json.dumps(
            {**d, "observations": [{**d["observations"][0], "stats": {**d["observations"][0]["stats"], "max": "big"}}]}
        ),
        "expected a number or one of 'nan', 'inf', '-inf', not 'big'",
        "$.observations[0].stats.max",
    ),
    "deeply_nested": (lambda d: "[" * 100_000 + "]" * 100_000, "JSON nested deeper than the parser allows", None),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_files_give_one_clear_error(kind: str, reports: list[qinsight.Report], tmp_path: Path) -> None:
    make, problem, location = BAD[kind]
    path = write(tmp_path, make(good_dict(reports)))
    with pytest.raises(ReportFileError) as info:
        load_report(path)
    error = info.value
    assert error.source == str(path) and problem in error.problem
    assert error.location == location
    assert str(error).startswith(f"{path}: ")


def test_binary_enormous_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ReportFileError, match="not UTF-8 text"):
        load_report(write(tmp_path, b"\x89PNG\r\n\x1a\n\xff\xfe"))
    with pytest.raises(ReportFileError, match="larger than the 100-byte limit"):
        load_report(write(tmp_path, "{" + " " * 200 + "}"), max_bytes=100)
    with pytest.raises(ReportFileError, match="No such file or directory"):
        load_report(tmp_path / "absent.json")


def test_newer_major_is_refused_naming_both_versions(reports: list[qinsight.Report]) -> None:
    text = json.dumps({**good_dict(reports), "schema_version": [SCHEMA_VERSION[0] + 1, 0]})
    major, minor = SCHEMA_VERSION
    expected = (
        rf"written with report schema {major + 1}\.0; "
        rf"this qinsight reads major version {major} \(schema {major}\.{minor}\)"
    )
    with pytest.raises(ReportVersionError, match=expected):
        report_from_json(text, source="future.json")


def test_newer_minor_loads_with_a_warning(reports: list[qinsight.Report]) -> None:
    data = {**good_dict(reports), "schema_version": [SCHEMA_VERSION[0], SCHEMA_VERSION[1] + 1], "new_thing": 1}
    with pytest.warns(UserWarning, match="newer than this qinsight's"):
        loaded = report_from_json(json.dumps(data), source="newer.json")
    assert loaded == reports[2]


def test_save_replaces_the_file_whole(reports: list[qinsight.Report], tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text("old")
    save_report(reports[2], path)
    assert load_report(path) == reports[2]
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary left behind


def test_schema_snapshot_matches_or_the_version_moved() -> None:
    snapshot = json.loads(SNAPSHOT.read_text())
    current = schema()
    if snapshot["classes"] == current["classes"]:
        assert snapshot["schema_version"] == current["schema_version"], "regenerate the snapshot: qinsight schema"
        return
    breaking, compatible = compatibility(snapshot["classes"], current["classes"])
    old, new = tuple(snapshot["schema_version"]), tuple(current["schema_version"])
    if breaking:
        assert new[0] > old[0], f"breaking schema changes need a major bump ({old} -> {new}): {breaking}"
    else:
        assert new > old, f"compatible schema changes need a minor bump ({old} -> {new}): {compatible}"
    pytest.fail(f"schema changed and the version moved to {new}: regenerate {SNAPSHOT.name} with `qinsight schema`")


def test_compatibility_classifies_changes() -> None:
    old = {
        "A": {"fields": {"x": {"type": "int", "required": True}, "y": {"type": "float", "required": False}}},
        "E": {"values": ["a", "b"]},
    }
    assert compatibility(old, old) == ([], [])
    new = {
        "A": {
            "fields": {
                "x": {"type": "int", "required": True},
                "y": {"type": "float", "required": False},
                "z": {"type": "str", "required": False},
            }
        },
        "E": {"values": ["a", "b", "c"]},
        "B": {"fields": {}},
    }
    assert compatibility(old, new) == ([], ["A.z added", "E value 'c' added", "B added"])
    # a Literal taking one more value reads every old file: compatible; one losing a value is not
    literal = {"A": {"fields": {"f": {"type": "Literal['fx', 'pt2e']", "required": True}}}}
    wider = {"A": {"fields": {"f": {"type": "Literal['fx', 'pt2e', 'torchao']", "required": True}}}}
    assert compatibility(literal, wider) == ([], ["A.f value 'torchao' added"])
    assert compatibility(wider, literal) == (
        ["A.f retyped Literal['fx', 'pt2e', 'torchao'] -> Literal['fx', 'pt2e']"],
        [],
    )
    broken = {
        "A": {"fields": {"x": {"type": "str", "required": True}, "w": {"type": "int", "required": True}}},
        "E": {"values": ["a"]},
    }
    breaking, _ = compatibility(old, broken)
    assert sorted(breaking) == ["A.w added (required)", "A.x retyped int -> str", "A.y removed", "E value 'b' removed"]


def test_plugin_findings_survive_a_reader_without_the_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_distribution(
        tmp_path / "plugin", "acme-widths", {"acme_widths": WIDTHS}, {"acme.widths": "acme_widths:WidthDetector"}
    )
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(root))
        report = qinsight.diagnose(
            seeded(MLP()), gaussian_batches((4, 16), 2), detectors=["acme.widths", "qinsight.per_channel"]
        )
        written = report_to_json(report)
        assert report_from_json(written) == report  # with the plugin: typed findings again
    sys.modules.pop("acme_widths", None)
    importlib.invalidate_caches()
    loaded = report_from_json(written, source="from-elsewhere.json")
    raw = loaded.result("acme.widths").findings
    assert all(isinstance(f, RawFinding) for f in raw)
    assert [(f.fqn, f.verdict, f.actionable, f.reason()) for f in raw] == [
        ("fc1", "narrow", False, "16 input features"),
        ("fc2", "wide", True, "32 input features"),
        ("fc3", "wide", True, "32 input features"),
    ]
    assert loaded.result("qinsight.per_channel") == report.result("qinsight.per_channel")
    assert json.loads(report_to_json(loaded)) == json.loads(written)  # written back unchanged
    assert "wide (2): fc2, fc3 -- 32 input features" in qinsight.to_text(loaded)


def _plan(**fields: Any) -> qinsight.QuantPlan:
    """A small FX plan that reached ``sqnr>=30``, with ``fields`` (its checks, another target...)."""
    made: dict[str, Any] = {
        "flow": "fx", "backend": "x86", "metric": "sqnr", "target": qinsight.types.Target.parse("sqnr>=30"),
        "reached": True, "default_score": 20.0, "verified_score": 31.0,
    }  # fmt: skip
    return qinsight.QuantPlan(**{**made, **fields})


def _saved_with(plan: qinsight.QuantPlan, path: Path) -> dict[str, Any]:
    """A report carrying only ``plan``, saved to ``path``, and the JSON the file holds (to rewrite as older
    schemas wrote it)."""
    metadata = ReportMetadata(model="m", frontend="fx", backend="x86", batches=1, qinsight_version="", torch_version="")
    report = qinsight.Report(metadata=metadata, sites=(), observations=(), results=(), suggestions=(), plan=plan)
    save_report(report, path)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_a_plans_checks_of_schema_3_7_are_read_with_their_kinds_from_their_words(tmp_path: Path) -> None:
    """3.8 added what a check is (``kinds``), which code acts on; a file written before says it only in
    words, and is read as if it had said the kinds (a dropped equalization still leaves the mapping)."""
    kinds = qinsight.types.SuggestionKind
    check = qinsight.types.SuggestionCheck
    checks = (
        check(fqn="", change="8 bits, clip-aware", kinds=(kinds.ACTIVATIONS,), before=20.0, alone=21.0, kept=True),
        check(fqn="fc1", change="equalize", kinds=(kinds.EQUALIZE,), before=20.0, alone=19.0, kept=False),
        check(
            fqn="fc2",
            change="activation dynamic, weight per_tensor",
            kinds=(kinds.DYNAMIC, kinds.PER_TENSOR),
            before=20.0,
            alone=22.0,
            kept=True,
        ),
        check(fqn="fc3", change="keep in float", kinds=(kinds.KEEP_FLOAT,), before=20.0, alone=25.0, kept=True),
    )
    plan = _plan(checks=checks)
    path = tmp_path / "r.json"
    data = _saved_with(plan, path)
    data["schema_version"] = [3, 7]
    for written in data["plan"]["checks"]:
        del written["kinds"]
    data["plan"]["checks"][0]["fqn"] = "(activations)"  # as 3.7 named the activation observing check
    path.write_text(json.dumps(data))
    loaded = load_report(path)
    assert loaded.plan is not None  # NaN scores (together, without) compare unequal: the fields that are read
    assert [(c.fqn, c.change, c.kinds, c.kept) for c in loaded.plan.checks] == [
        (c.fqn, c.change, c.kinds, c.kept) for c in checks
    ]
    assert [c.site for c in loaded.plan.checks] == ["(activations)", "fc1", "fc2", "fc3"]


@pytest.mark.parametrize("metric", ["sqnr", "kl"])
def test_a_budget_and_the_notes_of_a_file_before_4_0_read_as_their_types(tmp_path: Path, metric: str) -> None:
    """3.x wrote a sites budget as the target ``float<=N`` and a format plan's as ``{"bits": N}``: both read
    back as a :class:`Budget`, the plan's direction its metric's from the one table; a note, its text alone,
    reads back as a note of kind ``other``."""
    plan = _plan(metric=metric, target=qinsight.types.Budget(unit="float", limit=2.0))
    path = tmp_path / "r.json"
    data = _saved_with(plan, path)
    assert data["plan"]["target"] == {"unit": "float", "limit": 2.0}
    data["schema_version"] = [3, 8]
    data["plan"]["target"] = {"metric": "float", "threshold": 2.0, "higher_is_better": False}
    del data["plan"]["higher_is_better"]
    data["plan"]["notes"] = ["a note as 3.x wrote it"]
    path.write_text(json.dumps(data))
    loaded = load_report(path).plan
    assert loaded is not None and loaded.target == plan.target and loaded.higher_is_better == (metric == "sqnr")
    assert loaded.notes == (qinsight.types.Note(qinsight.types.NoteKind.OTHER, "a note as 3.x wrote it"),)
    assert STRICT.structure({"bits": 6.0}, qinsight.types.Budget) == qinsight.types.Budget(unit="bits", limit=6.0)


def test_a_checks_why_is_kept_and_a_reason_before_4_1_reads_as_kind_other(tmp_path: Path) -> None:
    """4.1 added a check's ``why``, the kind of its ``reason``: written and read back; a check written
    before says its reason in words alone, read back with the kind ``other`` (none where it said nothing)."""
    kinds, note_kinds = qinsight.types.SuggestionKind, qinsight.types.NoteKind
    check = qinsight.types.SuggestionCheck
    checks = (
        check(fqn="fc1", change="equalize", kinds=(kinds.EQUALIZE,), before=20.0, alone=19.0, kept=False,
              reason="not applied: -1 on the output", why=note_kinds.HURTS),
        check(fqn="fc2", change="keep in float", kinds=(kinds.KEEP_FLOAT,), before=20.0, alone=25.0, kept=True),
    )  # fmt: skip
    plan = _plan(checks=checks)
    path = tmp_path / "r.json"
    data = _saved_with(plan, path)
    loaded = load_report(path).plan
    assert loaded is not None and [(c.reason, c.why) for c in loaded.checks] == [(c.reason, c.why) for c in checks]
    data["schema_version"] = [4, 0]
    for written in data["plan"]["checks"]:
        written.pop("why", None)
    path.write_text(json.dumps(data))
    old = load_report(path).plan
    assert old is not None and [c.why for c in old.checks] == [note_kinds.OTHER, None]
    said = {
        "kind": "input-weight equalization",
        "modules": 2,
        "without": 30.0,
        "kept": False,
        "reason": "not applied: worse",
    }
    assert STRICT.structure(said, qinsight.types.KindCheck).why is note_kinds.OTHER
    assert STRICT.structure({**said, "why": "hurts"}, qinsight.types.KindCheck).why is note_kinds.HURTS
