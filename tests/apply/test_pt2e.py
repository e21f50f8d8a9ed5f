"""qinsight.pt2e_quantizer(report): every override checked in the converted graph, and better SQNR than
torchao's default X86InductorQuantizer on a model that needs the overrides."""

from __future__ import annotations

import copy
import sys
import warnings

import attrs
import pytest
import torch
from _checks import warns_note
from _data import gaussian_batches
from torch import nn

import qinsight
from qinsight.types import ActivationMode, NoteKind, QuantSuggestion, WeightScheme

pytest.importorskip("torchao")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )


class ThreeLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))
        return out


def nonstationary_with_outlier(n: int, seed: int) -> list[torch.Tensor]:
    """Batch scales alternate 0.2 / 5, and input channel 3 is 40x wider."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(32, 16, generator=g) * (0.2 if i % 2 else 5.0)
        x[:, 3] *= 40
        out.append(x)
    return out


def quantize(model: nn.Module, quantizer: object, data: list[torch.Tensor]) -> torch.fx.GraphModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(torch.export.export(copy.deepcopy(model), (data[0],)).module(), quantizer)
        for batch in data:
            prepared(batch)
        converted: torch.fx.GraphModule = convert_pt2e(prepared)
    return converted


def linear_modes(converted: torch.fx.GraphModule) -> dict[str, tuple[str, str]]:
    """Per Linear module: (activation: dynamic/static/float, weight: per_channel/per_tensor/float)."""
    modes = {}
    for node in converted.graph.nodes:
        if node.op != "call_function" or node.target != torch.ops.aten.linear.default:
            continue
        name = list(node.meta["nn_module_stack"].values())[-1][0]
        source, weight = node.args[0], node.args[1]
        activation = "float"
        if isinstance(source, torch.fx.Node) and "dequantize_per_tensor" in str(source.target):
            activation = "dynamic" if str(source.target).endswith(".tensor") else "static"
        weight_mode = "float"
        if isinstance(weight, torch.fx.Node) and "dequantize_per_channel" in str(weight.target):
            weight_mode = "per_channel"
        elif isinstance(weight, torch.fx.Node) and "dequantize_per_tensor" in str(weight.target):
            weight_mode = "per_tensor"
        modes[name] = (activation, weight_mode)
    return modes


def sqnr(model: nn.Module, converted: torch.fx.GraphModule, data: list[torch.Tensor]) -> float:
    with torch.no_grad():
        values = [20 * torch.log10(model(b).norm() / (model(b) - converted(b)).norm()).item() for b in data]
    return sum(values) / len(values)


def test_every_override_takes_effect_in_the_converted_graph() -> None:
    torch.manual_seed(0)
    model, data = ThreeLinear().eval(), gaussian_batches((8, 16), 4)
    report = qinsight.diagnose(model, data)
    report = attrs.evolve(
        report,
        suggestions=(
            QuantSuggestion(fqn="fc1", activation=ActivationMode.DYNAMIC, weight=WeightScheme.PER_CHANNEL),
            QuantSuggestion(fqn="fc2", activation=ActivationMode.STATIC, weight=WeightScheme.PER_TENSOR),
            QuantSuggestion(fqn="fc3", keep_float=True),
        ),
    )
    modes = linear_modes(quantize(model, qinsight.pt2e_quantizer(report), data))
    assert modes == {"fc1": ("dynamic", "per_channel"), "fc2": ("static", "per_tensor"), "fc3": ("float", "float")}
    # torchao's own module override is skipped (with a warning): fc1 stays static, hence the composition.
    plain = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    with pytest.warns(UserWarning, match="Skip the quantization config for fc1"):
        plain.set_module_name_qconfig("fc1", get_default_x86_inductor_quantization_config(is_dynamic=True))
    assert linear_modes(quantize(model, plain, data))["fc1"][0] == "static"


def test_suggested_quantizer_beats_the_default_on_held_out_batches() -> None:
    torch.manual_seed(0)
    model = ThreeLinear().eval()
    calibration, held_out = nonstationary_with_outlier(8, 0), nonstationary_with_outlier(6, 1)
    report = qinsight.diagnose(torch.export.export(copy.deepcopy(model), (calibration[0],)).module(), calibration)
    assert report.suggestion("fc1") is not None and report.suggestion("fc1").activation is ActivationMode.DYNAMIC  # type: ignore[union-attr]
    outlier = report.result("qinsight.outliers").finding("fc1")
    assert 3 in outlier.magnitude_channels  # type: ignore[attr-defined]
    with warns_note(NoteKind.UNEQUALIZED):
        ours = quantize(model, qinsight.pt2e_quantizer(report), calibration)
    default = quantize(
        model, X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()), calibration
    )
    ours_db, default_db = sqnr(model, ours, held_out), sqnr(model, default, held_out)
    assert ours_db > default_db + 1.0, (ours_db, default_db)


def test_without_torchao_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, data = ThreeLinear().eval(), gaussian_batches((8, 16), 2)
    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    report = qinsight.diagnose(torch.export.export(model, (data[0],)).module(), data)  # the rest works
    with pytest.raises(qinsight.errors.MissingExtraError, match=r"needs torchao: pip install 'qinsight\[pt2e\]'"):
        qinsight.pt2e_quantizer(report)


# --- the ops around the layers -------------------------------------------------------------------


class Conv1dOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv1d(4, 8, 3), nn.Conv1d(8, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(torch.relu(self.a(x)))
        return out


def _pt2e(model: nn.Module, quantizer: object, calibration: list[torch.Tensor]) -> torch.fx.GraphModule:
    exported = torch.export.export(copy.deepcopy(model), (calibration[0],)).module()
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    for batch in calibration:
        prepared(batch)
    converted: torch.fx.GraphModule = convert_pt2e(prepared)
    return converted


def test_the_quantizer_says_which_suggested_sites_it_leaves_float() -> None:
    torch.manual_seed(0)
    model, data = Conv1dOnly().eval(), gaussian_batches((2, 4, 32), 3)
    report = qinsight.diagnose(model, data)
    assert {s.fqn for s in report.suggestions if s.weight is WeightScheme.PER_CHANNEL} == {"a", "b"}
    quantizer = qinsight.pt2e_quantizer(report)
    with pytest.warns(UserWarning, match="X86InductorQuantizer does not apply the report to 2 sites.*: a, b"):
        converted = _pt2e(model, quantizer, data)
    assert quantizer.unhonoured == ("a", "b")
    assert not any("quantize" in str(node.target) for node in converted.graph.nodes)  # nothing was quantized indeed


def test_ops_kept_float_lose_their_annotations() -> None:
    from _data import residual_stream
    from _models import ResidualBlock
    from _peers import outputs, sqnr

    from qinsight.backends.x86 import default_x86_quantizer
    from qinsight.frontends import exported_op_names

    torch.manual_seed(0)
    model, calibration, held_out = ResidualBlock().eval(), residual_stream(4, 0), residual_stream(4, 1)
    report = qinsight.diagnose(model, calibration)
    kept = {s.fqn for s in report.suggestions if s.keep_float}
    assert {"add#0", "add#1", "norm1", "norm2"} <= kept
    # the exported graph's aten ops carry the names the FX frontend gave the float model's ops
    exported = torch.export.export(copy.deepcopy(model), (calibration[0],)).module()
    assert set(exported_op_names(exported).values()) == {s.fqn for s in report.sites if not s.kind.is_layer}
    by_default = copy.deepcopy(exported)
    default_x86_quantizer().annotate(by_default)
    assert {"add#0", "add#1"} <= {
        n for node, n in exported_op_names(by_default).items() if node.meta.get("quantization_annotation")
    }
    quantizer = qinsight.pt2e_quantizer(report)
    quantizer.annotate(exported)
    annotated = {name for node, name in exported_op_names(exported).items() if node.meta.get("quantization_annotation")}
    assert quantizer.unhonoured == () and not annotated & kept
    reference = outputs(model, held_out)
    default = sqnr(reference, outputs(_pt2e(model, default_x86_quantizer(), calibration), held_out))
    advised = sqnr(reference, outputs(_pt2e(model, qinsight.pt2e_quantizer(report), calibration), held_out))
    assert advised >= default - 0.1  # measured 63.7 dB both: X86InductorQuantizer leaves these adds alone


def _annotations(graph: torch.fx.GraphModule) -> dict[str, tuple[object, ...]]:
    """Each annotated node's annotation, by node names and spec fields: comparable across two runs."""

    def spec(s: object) -> object:
        if s is None:
            return None
        shared = getattr(s, "edge_or_node", None)
        if shared is not None:
            return ("shared", tuple(n.name for n in shared) if isinstance(shared, tuple) else shared.name)
        return (type(s).__name__, *(getattr(s, f, None) for f in ("dtype", "qscheme", "ch_axis", "is_dynamic")))

    found = {}
    for node in graph.graph.nodes:
        a = node.meta.get("quantization_annotation")
        if a is not None:
            inputs = tuple(sorted((src.name, spec(s)) for src, s in a.input_qspec_map.items()))
            found[node.name] = (
                inputs,
                spec(a.output_qspec),
                a._annotated,
                getattr(a, "_is_output_of_quantized_pattern", None),
            )
    return found


@pytest.mark.parametrize(
    "example", [pytest.param("mobilenet_v2", marks=pytest.mark.slow), "encoder"]
)  # real MobileNetV2 in the whole suite's tier
def test_the_grouped_quantizer_annotates_node_for_node_as_torchaos_per_module_passes(example: str) -> None:
    """GroupedX86InductorQuantizer annotates the modules sharing a config in one pass (a PT2E plan
    annotates every config it simulates); on random mixes of float, per-tensor and dynamic modules
    its annotations are torchao's, node for node."""
    import random

    from torchao.quantization.pt2e import observer

    from qinsight.apply.pt2e import per_tensor_weights
    from qinsight.backends.grouped_x86 import GroupedX86InductorQuantizer
    from qinsight.examples import EncoderLayer
    from qinsight.examples.mobilenet import MobileNetV2

    model: nn.Module = (
        MobileNetV2()
        if example == "mobilenet_v2"
        else nn.Sequential(EncoderLayer(64, 4, 128), EncoderLayer(64, 4, 128))
    )
    x = torch.randn(1, 3, 224, 224) if example == "mobilenet_v2" else torch.randn(2, 16, 64)
    graph = torch.export.export(model.eval(), (x,)).module()
    layers = [name for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    static = get_default_x86_inductor_quantization_config()
    dynamic = get_default_x86_inductor_quantization_config(is_dynamic=True)
    rng = random.Random(0)
    for trial in range(4):
        mode = "static" if trial % 2 == 0 else "dynamic"
        kinds = (
            [None, per_tensor_weights(static, observer)]
            if mode == "static"
            else [dynamic, per_tensor_weights(dynamic, observer)]
        )
        entries = {name: rng.choice(kinds) for name in rng.sample(layers, k=len(layers) // 3)}
        annotations = []
        for kind in (X86InductorQuantizer, GroupedX86InductorQuantizer):
            quantizer = kind().set_global(static) if mode == "static" else kind()
            for name, config in entries.items():
                quantizer.set_module_name_qconfig(name, config)
            for node in graph.graph.nodes:
                node.meta.pop("quantization_annotation", None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantizer.annotate(graph)
            annotations.append(_annotations(graph))
            assert quantizer.module_name_qconfig == entries  # the entries stay as set
        assert annotations[0]  # something was annotated
        assert annotations[1] == annotations[0]


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_the_advice_comes_back_as_an_xnnpack_quantizer_that_honours_every_override() -> None:
    xnnpack = pytest.importorskip("executorch.backends.xnnpack.quantizer.xnnpack_quantizer")
    torch.manual_seed(0)
    model, data = ThreeLinear().eval(), gaussian_batches((8, 16), 4)
    report = attrs.evolve(
        qinsight.diagnose(model, data, verify=False),
        suggestions=(
            QuantSuggestion(fqn="fc1", activation=ActivationMode.DYNAMIC, weight=WeightScheme.PER_CHANNEL),
            QuantSuggestion(fqn="fc2", activation=ActivationMode.STATIC, weight=WeightScheme.PER_TENSOR),
            QuantSuggestion(fqn="fc3", keep_float=True),
        ),
    )
    quantizer = qinsight.pt2e_quantizer(report, backend="xnnpack")
    assert isinstance(quantizer.inner, xnnpack.XNNPACKQuantizer)
    converted = quantize(model, quantizer, data)
    # fc3 computes in float with its float weight; what it reads is fc2's output, which XNNPACK
    # quantizes as part of fc2's linear-relu pattern (X86InductorQuantizer leaves it float)
    assert linear_modes(converted) == {
        "fc1": ("dynamic", "per_channel"),
        "fc2": ("static", "per_tensor"),
        "fc3": ("static", "float"),
    }
    assert quantizer.unhonoured == ()
    # and it lowers: the program runs the two quantized Linears in XNNPACK, fc3 in float
    lowered = qinsight.compare_lowered(model, converted, data[:2], layers=False, float_program=False)
    assert lowered.metric("lowered_vs_float") > 20.0
    with pytest.raises(qinsight.errors.InvalidParameterError, match=r"one of (\w+, )*x86, xnnpack for flow='pt2e'"):
        qinsight.pt2e_quantizer(report, backend="qnnpack")
