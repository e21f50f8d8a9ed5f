"""A site is a call, not a module: a module called at several places of a forward is a site per call,
in every frontend, with its own observations, findings and comparison rows; a module whose forward
holds several ops (a pad, then a functional conv) is read where its quantized form reads."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _checks import examples, warns_note
from _data import gaussian_batches
from _models import TwiceLinear, seeded
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import qinsight
import qinsight.frontends
from qinsight.core.advice import advice_of
from qinsight.core.notes import NoteKind
from qinsight.core.sites import OpKind, Side
from qinsight.errors import ComparisonError
from qinsight.examples.builtin import example
from qinsight.examples.mobilenet import Conv2dSamePadding, PaddedMobileNetV2
from qinsight.frontends import exported_view
from qinsight.outputs.tables import config_table


class Shapes(nn.Module):
    """The issue's reproduction: one ReLU6 module on 32 channels, then on 8."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.act = nn.Linear(16, 32), nn.Linear(32, 8), nn.ReLU6()

    def forward(self, x: torch.Tensor) -> Any:
        return self.act(self.b(self.act(self.a(x))))


class FiftyTimes(nn.Module):
    """One ReLU6 called on balanced channels, then on channels one of which is 50x the others."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.act = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4), nn.ReLU6()
        spread = torch.ones(16)
        spread[0] = 50.0
        self.register_buffer("spread", spread)

    def forward(self, x: torch.Tensor) -> Any:
        return self.c(self.act(self.b(self.act(self.a(x))) * self.spread))


def _inputs_of_act(model: nn.Module, data: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """What each call of ``model.act`` reads, batch by batch, seen by a plain hook."""
    seen: list[torch.Tensor] = []
    hook = model.act.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    with torch.no_grad():
        for batch in data:
            model(batch)
    hook.remove()
    calls = len(seen) // len(data)
    return [seen[call::calls] for call in range(calls)]


@pytest.mark.parametrize("frontend", ["fx", "eager"])
def test_a_reused_activation_is_a_site_per_call_with_its_own_range(frontend: str) -> None:
    model, data = seeded(Shapes()), gaussian_batches((8, 16), 4)
    report = qinsight.diagnose(model, data, frontend=frontend)  # raised "a batch has 8 channels" before
    assert [(s.fqn, s.occurrence) for s in report.sites if s.module == "act"] == [("act", 0), ("act#1", 1)]
    for name, seen in zip(("act", "act#1"), _inputs_of_act(model, data)):
        stats = report.observation(name, Side.PRE).stats
        assert stats.batches == len(data)
        assert stats.min == pytest.approx(min(float(t.min()) for t in seen), abs=1e-6)
        assert stats.max == pytest.approx(max(float(t.max()) for t in seen), abs=1e-6)


def test_the_exported_frontend_observes_each_call_apart() -> None:
    model, data = seeded(Shapes()), gaussian_batches((8, 16), 4)
    exported = torch.export.export(copy.deepcopy(model), (data[0],)).module()
    view = exported_view(exported)
    assert [(s.fqn, s.occurrence) for s in view.ops] == [("act", 0), ("act#1", 1)]
    widths: dict[str, set[int]] = {"act": set(), "act#1": set()}
    detach = [view.attach(name, Side.PRE, lambda x, name=name: widths[name].add(x.shape[-1])) for name in widths]
    with torch.no_grad():
        exported(data[0])
    for stop in detach:
        stop()
    assert widths == {"act": {32}, "act#1": {8}}
    assert qinsight.diagnose(exported, data).metadata.frontend == "export"  # no error either


@pytest.mark.parametrize("frontend", ["fx", "eager"])
def test_two_calls_of_one_module_get_their_own_verdicts(frontend: str) -> None:
    model, data = seeded(FiftyTimes()), gaussian_batches((8, 16), 4)
    report = qinsight.diagnose(model, data, frontend=frontend, verify=False)
    (precision,) = [result for result in report.results if result.detector == "qinsight.precision"]
    verdicts = {finding.fqn: finding.verdict for finding in precision.findings}
    # the 50x channel leaves the second call's median channel about 2.4 of 8 bits; the first keeps them all
    assert verdicts["act"] == "enough bits" and verdicts["act#1"] == "too few bits"
    suggested = {s.fqn for s in report.suggestions if s.keep_float}
    assert "act#1" in suggested and "act" not in suggested


def test_fx_configures_a_module_once_and_says_which_calls_disagreed() -> None:
    model, data = seeded(FiftyTimes()), gaussian_batches((8, 16), 4)
    report = qinsight.diagnose(model, data, frontend="fx", verify=False)
    fx = advice_of(report, "fx")
    merged = [note for note in fx.notes if note.kind is NoteKind.CALLS_MERGED]
    assert merged and "act" in merged[0].text
    # the FX config keeps the module float for both calls: set_module_name cannot tell them apart
    assert {s.fqn for s in fx.suggestions if s.keep_float} >= {"act", "act#1"}
    with warns_note(NoteKind.CALLS_MERGED):  # said where the config is built, as every advice note
        mapping = qinsight.qconfig_mapping(report)
    assert mapping.module_name_qconfigs["act"] is None
    # PT2E strips one call's annotations: only the second call is kept float there
    pt2e = advice_of(report, "pt2e")
    assert {s.fqn for s in pt2e.suggestions if s.keep_float} & {"act", "act#1"} == {"act#1"}
    assert not [note for note in pt2e.notes if note.kind is NoteKind.CALLS_MERGED]


def test_a_report_file_keeps_its_call_sites(tmp_path: Path) -> None:
    model, data = seeded(TwiceLinear()), gaussian_batches((4, 8), 3)
    report = qinsight.diagnose(model, data, verify=False)
    qinsight.save_report(report, tmp_path / "report.json")
    loaded = qinsight.load_report(tmp_path / "report.json")
    assert loaded == report
    assert [(s.fqn, s.occurrence, s.module) for s in loaded.sites if s.kind.is_layer] == [
        ("shared", 0, "shared"),
        ("shared#1", 1, "shared"),
        ("out", 0, "out"),
    ]
    # the calls share one weight: observed once, found from either call
    assert loaded.observation("shared#1", Side.WEIGHT) is loaded.observation("shared", Side.WEIGHT)


def test_the_resnet18_examples_blocks_are_compared_at_each_call_of_their_relu() -> None:
    # Its blocks call one ReLU twice: after conv1's batch norm, and after the residual add. FX fuses the
    # first into conv1 (ConvReLU2d), so conv1 is compared at the ReLU's first call, and only there.
    from _peers import quantized_fx

    model = example("resnet18").model()
    data = gaussian_batches((2, 3, 64, 64), 2)
    chains = qinsight.frontends.model_structure(model).chains
    assert [name for name, _ in chains["blocks.0.conv1"]] == ["blocks.0.bn1", "blocks.0.relu"]
    _, converted = quantized_fx(model, data)
    comparison = qinsight.compare_activations(model, converted, data, metrics=["sqnr"])
    conv1 = comparison.layer("blocks.0.conv1")
    assert conv1.compared_at == "blocks.0.relu" and conv1.batches == len(data)
    assert conv1.metric("sqnr") > 20  # compared with the first call's output, not the block's


class Pool(nn.Module):
    """A few modules of one width, called in the order ``calls`` gives, each call scaled by its own factor."""

    def __init__(self, calls: list[tuple[int, float]]) -> None:
        super().__init__()
        self.calls = calls
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
        self.acts = nn.ModuleList([nn.ReLU6(), nn.Hardtanh(-2.0, 2.0)])

    def forward(self, x: torch.Tensor) -> Any:
        for index, scale in self.calls:
            x = self.layers[index](x) if index < 3 else self.acts[index - 3](x * scale)
        return x


@settings(max_examples=examples(25), deadline=None)
@given(
    calls=st.lists(st.tuples(st.integers(0, 4), st.floats(0.1, 20.0)), min_size=1, max_size=7),
    frontend=st.sampled_from(["fx", "eager"]),
)
def test_any_reuse_pattern_gives_a_site_per_call_each_observing_its_own_call(
    calls: list[tuple[int, float]], frontend: str
) -> None:
    model, data = seeded(Pool(calls)), gaussian_batches((4, 8), 2)
    report = qinsight.diagnose(model, data, frontend=frontend, verify=False)
    names = ["layers.0", "layers.1", "layers.2", "acts.0", "acts.1"]
    expected, seen = [], dict.fromkeys(names, 0)
    for index, _scale in calls:
        expected.append(names[index] if seen[names[index]] == 0 else f"{names[index]}#{seen[names[index]]}")
        seen[names[index]] += 1
    assert sorted(s.fqn for s in report.sites if s.call is None) == sorted(expected)
    # every call's input, read with plain hooks that count the calls: each site's range is its own call's
    inputs: dict[str, list[torch.Tensor]] = {}
    count: dict[str, int] = {}

    def recorder(name: str) -> Any:
        def record(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            site = name if count.get(name, 0) == 0 else f"{name}#{count[name]}"
            count[name] = count.get(name, 0) + 1
            inputs.setdefault(site, []).append(args[0])

        return record

    hooks = [model.get_submodule(name).register_forward_pre_hook(recorder(name)) for name in names]
    with torch.no_grad():
        for batch in data:
            count.clear()
            model(batch)
    for hook in hooks:
        hook.remove()
    observed = {o.fqn: o.stats for o in report.observations if o.side is Side.PRE and "[" not in o.key}
    for site, tensors in inputs.items():
        if site in observed:
            assert observed[site].max == pytest.approx(max(float(t.max()) for t in tensors), rel=1e-6, abs=1e-6)


# --- modules that hold several ops: a padding Conv2d subclass, read at its conv -------------------------------


class PaddedBlock(nn.Module):
    """The pattern of the issue's model at small size: padding conv subclasses calling F.conv2d, separate
    batch norms, one ReLU6 called after both convs."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = Conv2dSamePadding(3, 8, 3, 2)
        self.bn0 = nn.BatchNorm2d(8)
        self.depthwise = Conv2dSamePadding(8, 8, 3, 1, groups=8)
        self.bn1 = nn.BatchNorm2d(8)
        self.act = nn.ReLU6()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> Any:
        x = self.act(self.bn1(self.depthwise(self.act(self.bn0(self.stem(x))))))
        return self.head(x.mean((2, 3)))


def _randomized_norms(model: nn.Module) -> nn.Module:
    """Batch norms with the spread of a trained network's: per-channel scales 0.05-3."""
    generator = torch.Generator().manual_seed(5)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.weight.data = torch.rand(module.num_features, generator=generator) * 3 + 0.05
            module.running_var = torch.rand(module.num_features, generator=generator) * 0.05 + 1e-3
    return model


@pytest.mark.parametrize("frontend", ["fx", "eager"])
def test_a_padding_conv_is_read_at_its_functional_conv(frontend: str) -> None:
    model, data = seeded(PaddedBlock()), gaussian_batches((2, 3, 16, 16), 3)
    report = qinsight.diagnose(model, data, frontend=frontend, verify=False)
    layers = {s.fqn: s for s in report.sites if s.kind.is_layer}
    assert set(layers) == {"stem", "depthwise", "head"}
    stem = layers["stem"]
    assert stem.call is not None and stem.call.target == "torch.nn.functional.conv2d" and stem.groups == 1
    assert layers["depthwise"].groups == 8
    # the input observed is the padded one (zeros on the border), as the quantized conv reads it
    padded = F.pad(data[0], (1, 1, 1, 1))
    assert report.observation("stem", Side.PRE).stats.min <= min(0.0, float(padded.min()))


def test_fx_collapse_on_unfolded_batch_norms_is_named() -> None:
    model, data = _randomized_norms(seeded(PaddedBlock())), gaussian_batches((4, 3, 16, 16), 8)
    report = qinsight.diagnose(model, data, frontend="fx")
    norms = [s for s in report.sites if s.kind is OpKind.BATCH_NORM]
    assert [s.fqn for s in norms] == ["bn0", "bn1"] and norms[0].source == "stem"
    (fx,) = [v for v in report.verification if v.flow == "fx"]
    (said,) = [note for note in fx.notes if note.kind is NoteKind.UNFOLDED_NORMS]
    assert "bn0 after stem" in said.text
    # a Conv module's batch norm is folded by FX: no site, no note
    plain = qinsight.diagnose(seeded(_ConvModules()), data, frontend="fx")
    assert not [s for s in plain.sites if s.kind is OpKind.BATCH_NORM]
    assert not [n for v in plain.verification for n in v.notes if n.kind is NoteKind.UNFOLDED_NORMS]


class _ConvModules(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.act, self.head = (
            nn.Conv2d(3, 8, 3, 2, 1),
            nn.BatchNorm2d(8),
            nn.ReLU6(),
            nn.Linear(8, 4),
        )

    def forward(self, x: torch.Tensor) -> Any:
        return self.head(self.act(self.bn(self.conv(x))).mean((2, 3)))


def test_fx_rows_for_functional_convs_hold_their_quantized_weight() -> None:
    from _peers import quantized_fx

    model, data = _randomized_norms(seeded(PaddedBlock())), gaussian_batches((2, 3, 16, 16), 3)
    _, converted = quantized_fx(model, data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comparison = qinsight.compare_activations(model, converted, data, metrics=["sqnr"])
    assert not [w for w in caught if "not compared" in str(w.message)]  # a conv call is no op row to match
    rows = {row.fqn: row for row in comparison.layers}
    assert rows["stem"].quantized_type == "quantized.conv2d" and rows["stem"].batches == len(data)
    assert rows["stem"].compared_at == "stem"  # FX keeps the batch norm apart: compared before it
    weights = qinsight.compare_weights(model, converted)
    stem = weights.layer("stem")
    assert stem.metric("sqnr") > 30  # int8 per-channel weights of a 3x3 conv, read from the packed weight


@pytest.mark.slow  # 20 s: three PT2E quantizations of a 53-layer network
def test_xnnpack_and_x86_compared_on_padding_convs_and_a_reused_activation() -> None:
    pytest.importorskip("executorch")
    from qinsight.backends.x86 import default_x86_quantizer
    from qinsight.backends.xnnpack import default_xnnpack_quantizer

    model = seeded(PaddedMobileNetV2(num_classes=10))
    data = gaussian_batches((2, 3, 64, 64), 3)
    report = qinsight.diagnose(model, data, verify=False)
    configs = {
        "xnnpack": default_xnnpack_quantizer(),
        "x86": default_x86_quantizer(),
        "report-x86": qinsight.pt2e_quantizer(report),  # gives a subclass's conv its torch layer's source
    }
    comparison = qinsight.compare_configs(model, configs, data[:2], data[2:])  # a ValueError before
    rows = {row.fqn: {score.config for score in row.scores} for row in comparison.rows}
    assert len(rows) == 53
    assert all(configs_of >= {"xnnpack", "report-x86"} for configs_of in rows.values())  # rows for both
    # where they part: torchao's x86 quantizer matches convs by their module's exact class
    assert rows["classifier"] == {"xnnpack", "x86", "report-x86"} and rows["stem"] == {"xnnpack", "report-x86"}
    assert "x86 leaves 52 in float that another quantizes: stem" in config_table(comparison).note


class Sliced(nn.Linear):
    """A Linear whose forward slices what its F.linear gives: module and op outputs differ in shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)[:, :4]


class SlicedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = Sliced(8, 8)

    def forward(self, x: torch.Tensor) -> Any:
        return self.fc(x)


def test_a_shape_that_still_disagrees_is_one_error_naming_the_site() -> None:
    pytest.importorskip("torchao")
    from _peers import pt2e_quantized

    model, data = seeded(SlicedModel()), gaussian_batches((4, 8), 2)
    converted, _reference = pt2e_quantized(model, data)
    structure = qinsight.frontends.model_structure(model)
    del structure.inner["fc"]  # as if read at the module: its output is sliced, the op's is not
    with pytest.raises(ComparisonError, match=r"^fc cannot be compared at fc: the float output has shape \(4, 4\)"):
        qinsight.compare_activations(model, converted, data, structure=structure)


def test_a_config_that_cannot_run_is_one_error_naming_it() -> None:
    from qinsight.backends.x86 import default_x86_quantizer
    from qinsight.errors import FrontendError

    class Broken:  # a quantizer whose annotate raises, as a flow's might on a model it cannot take
        def annotate(self, model: Any) -> Any:
            raise RuntimeError("Found <class 'Cache'> in output, which is not a known type.\nmore lines")

        def transform_for_annotation(self, model: Any) -> Any:
            return model

        def validate(self, model: Any) -> None:
            pass

    model, data = seeded(SlicedModel()), gaussian_batches((4, 8), 3)
    with pytest.raises(
        FrontendError, match=r"^config 'broken' cannot prepare SlicedModel: RuntimeError: Found .*type\.; "
    ):
        qinsight.compare_configs(model, {"x86": default_x86_quantizer(), "broken": Broken()}, data[:2], data[2:])


def test_fx_observes_a_modules_calls_alike_never_clipping_a_call_no_clip_follows() -> None:
    # One Linear called twice, after a quantized Linear: a ReLU6 alone reads the first call's output,
    # nothing clips the second's. FX's set_module_name serves both calls with one observer.
    from qinsight.apply.qconfigs import advice_entries
    from qinsight.core.fx_activations import FxActivations
    from qinsight.core.sites import OpSite

    def linear(fqn: str, **fields: Any) -> OpSite:
        return OpSite(fqn=fqn, kind=OpKind.LINEAR, module_type="Linear", **fields)

    sites = (
        linear("first"),
        linear("shared", source="first", clip=(0.0, 6.0)),
        linear("shared#1", occurrence=1, source="shared"),
        linear("out", source="shared#1"),
    )
    alone = advice_entries(sites[:2], (), "x86", FxActivations())
    assert "ClippedHistogramObserver" in [e.choice.code for e in alone if e.key == ("shared",)][0]
    entries = advice_entries(sites, (), "x86", FxActivations())
    codes = [e.choice.code for e in entries if e.key == ("shared",)]
    assert not any("Clipped" in code for code in codes)  # a clip would cut the second call off: the global one
