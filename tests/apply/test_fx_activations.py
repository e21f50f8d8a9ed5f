"""qinsight's FX activation observing: 8 bits where fbgemm's kernels do not saturate, a layer that a
clip alone reads observed as the clip leaves it, and the facts of the graph it rests on."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _checks import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import fx, nn
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.observer import HistogramObserver
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight
from qinsight.apply.clipped import ClippedHistogramObserver
from qinsight.apply.qconfigs import advice_mapping
from qinsight.core.fx_activations import FxActivations
from qinsight.core.suggestions import QuantSuggestion
from qinsight.frontends.fx import fx_view
from qinsight.pipeline import saturation
from qinsight.pipeline.saturation import checked_activations, saturated


class Blocks(nn.Module):
    """The shapes FX observes differently: a first conv reading the model input, conv-BN-ReLU6,
    a functional relu6, a fused ReLU, a residual add feeding a conv, a Linear into a hardtanh."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6())
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.relu = nn.ReLU()
        self.expand = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 4)
        self.clip = nn.Hardtanh(-1.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = F.relu6(self.dw(x))
        y = x + self.relu(self.pw(x))
        z = torch.clamp(self.expand(y), 0.0, 6.0)  # a clamp is no hardtanh: not a clip FX shares
        return self.clip(self.fc(z.mean((2, 3))))


def _sites(model: nn.Module, example: torch.Tensor) -> dict[str, Any]:
    view = fx_view(model, None, example)
    return {site.fqn: site for site in view.sites + view.ops}


def test_the_fx_frontend_reads_what_feeds_each_site_and_which_clip_reads_it() -> None:
    sites = _sites(Blocks().eval(), torch.randn(2, 3, 8, 8))
    assert (sites["stem.0"].source, sites["stem.0"].clip) == (None, (0.0, 6.0))  # the model input feeds it
    assert (sites["dw"].source, sites["dw"].clip) == ("stem.2", (0.0, 6.0))  # F.relu6 after it
    assert (sites["pw"].source, sites["pw"].clip) == ("relu6#0", None)  # the fused ReLU is no clip
    assert (sites["relu6#0"].source, sites["stem.2"].source) == ("dw", "stem.0")  # back through the BatchNorm
    assert (sites["add#0"].source, sites["expand"].source, sites["expand"].clip) == ("relu6#0", "add#0", None)
    assert (sites["fc"].source, sites["fc"].clip) == (None, (-1.0, 1.0))  # a mean, no site, feeds it


@pytest.mark.slow  # against torch's HistogramObserver: the whole suite's tier, on hypothesis' CI profile
@settings(max_examples=8, deadline=None)
@given(
    values=st.lists(st.floats(-50, 50, allow_nan=False, width=32), min_size=2, max_size=200),
    bounds=st.tuples(st.floats(-5, 0), st.floats(0.5, 10)),
    reduce_range=st.booleans(),
)
def test_the_clipped_observer_is_torchs_histogram_of_the_clipped_values(
    values: list[float], bounds: tuple[float, float], reduce_range: bool
) -> None:
    x = torch.tensor(values)
    lower, upper = bounds
    clipped = ClippedHistogramObserver(lower=lower, upper=upper, reduce_range=reduce_range)
    plain = HistogramObserver(reduce_range=reduce_range)
    assert clipped(x) is x  # observing passes the values through
    plain(x.clamp(lower, upper))
    assert [float(t) for t in clipped.calculate_qparams()] == [float(t) for t in plain.calculate_qparams()]
    with pytest.raises(ValueError, match="lower < upper"):
        ClippedHistogramObserver(lower=1.0, upper=1.0)


def _clipped_observers(model: nn.Module, mapping: Any, example: torch.Tensor) -> dict[str, list[str]]:
    """Each ClippedHistogramObserver of ``prepare_fx``'s graph -> the nodes whose values it observes
    (a module's name, else the node's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_fx(copy.deepcopy(model), mapping, (example,))
    assert isinstance(prepared, fx.GraphModule)
    seen: dict[str, list[str]] = {}
    for node in prepared.graph.nodes:
        if node.op == "call_module" and isinstance(prepared.get_submodule(node.target), ClippedHistogramObserver):
            owner = id(prepared.get_submodule(node.target))
            source = node.args[0]
            seen.setdefault(str(owner), []).append(str(source.target) if source.op == "call_module" else source.name)
    return seen


def test_a_layer_is_observed_clipped_only_where_its_producer_observes_its_input() -> None:
    from qinsight.examples.mobilenet import MobileNetV2

    model, x = MobileNetV2().eval(), torch.randn(1, 3, 224, 224)
    view = fx_view(model, None, x)
    sites = view.sites + view.ops
    activations = FxActivations()
    code = "\n".join(entries_code_for(sites, (), activations))
    assert "mapping.set_module_name('features.0.0'" not in code  # it reads the image: clipping would clip it
    assert "mapping.set_module_name('features.1.conv.0.0', QConfig(activation=ClippedHistogramObserver" in code
    observed = _clipped_observers(model, advice_mapping(sites, (), "x86", None, activations), x)
    assert len(observed) == 34 and all(_after_the_layer(nodes) for nodes in observed.values()), observed
    # with the residual add before features.4 in float, FX observes its conv's input with the conv's qconfig
    floated = (QuantSuggestion(fqn="features.3.add#0", keep_float=True),)
    code = "\n".join(entries_code_for(sites, floated, activations))
    assert "'features.4.conv.0.0', QConfig(activation=ClippedHistogramObserver" not in code
    # a ReLU6 kept float between quantized convs still runs on the quantized tensor: the depthwise conv is clipped
    floated = (QuantSuggestion(fqn="features.4.conv.0.2", keep_float=True),)
    assert "'features.4.conv.1.0', QConfig(activation=ClippedHistogramObserver" in "\n".join(
        entries_code_for(sites, floated, activations)
    )
    observed = _clipped_observers(model, advice_mapping(sites, floated, "x86", None, activations), x)
    assert all(_after_the_layer(nodes) for nodes in observed.values()), observed


def _after_the_layer(nodes: list[str]) -> bool:
    """A clipped observer sees its layer's output, its ReLU6's (already clipped), and what keeps their
    qparams (the last conv's pool and flatten), never an unclipped input: the image, an add's output."""
    return all(n.startswith("features.") or n in ("adaptive_avg_pool2d", "flatten") for n in nodes)


def entries_code_for(
    sites: tuple[Any, ...], suggestions: tuple[QuantSuggestion, ...], activations: FxActivations
) -> list[str]:
    report = qinsight.Report(
        metadata=qinsight.types.ReportMetadata(
            model="m", frontend="fx", backend="x86", batches=1, qinsight_version="", torch_version=""
        ),
        sites=sites,
        observations=(),
        results=(),
        suggestions=suggestions,
        fx_activations=activations,
    )
    return qinsight.config_code(report)


def test_a_kernel_that_saturates_at_eight_bits_reads_its_input_at_seven() -> None:
    """MobileNetV2 observed as torch does, before each ReLU6: the depthwise convs' 8-bit inputs sit
    around a mid-range zero point, and fbgemm's 16-bit pair sums overflow. Which other kernels
    saturate is the CPU's: without VNNI (AVX2 only) fbgemm's u8 x s8 pairs saturate in the 1x1 and
    first convs too (docs/backends.md), so this asserts the depthwise ones and the cure, not the set."""
    import attrs

    from qinsight.examples.mobilenet import MobileNetV2

    torch.manual_seed(0)
    model, batch = MobileNetV2().eval(), torch.randn(2, 3, 128, 128)
    view = fx_view(model, None, batch)
    sites = tuple(attrs.evolve(site, clip=None) for site in view.sites + view.ops)

    def mapping(activations: FxActivations) -> Any:
        return advice_mapping(sites, (), "x86", None, activations)

    def excess(activations: FxActivations) -> dict[str, float]:
        prepared = prepare_fx(copy.deepcopy(model), mapping(activations), (batch,))
        with torch.no_grad():
            prepared(batch)
        return saturated(convert_fx(prepared), batch)[0]

    checked = checked_activations(model, batch, "x86", mapping)
    assert checked is not None and checked.kernels == 53
    before = {n.fqn for n in checked.narrowed if n.excess > 100}  # saturating the first time round
    depthwise = {fqn for fqn in before if ".conv.1.0" in fqn}
    assert len(before) >= 3 and depthwise  # on every CPU some depthwise conv saturates
    assert max(excess(checked).values(), default=0.0) <= 1.0  # narrowed, nothing saturates
    # each narrowed depthwise input is observed at 7 bits by its producer, the expand conv before the ReLU6
    code = "\n".join(entries_code_for(sites, (), checked))
    for fqn in depthwise:
        producer = fqn.replace(".conv.1.0", ".conv.0.0")
        assert (
            f"mapping.set_module_name({producer!r}, QConfig(activation=HistogramObserver.with_args(reduce_range=True)"
            in code
        )
    assert "clip-aware (53 quantized kernels checked at 8 bits; inputs of features." in checked.describe()


def _checked_kernels(activations: FxActivations | None) -> int:
    """How many kernels the check ran. Which of them saturate is the CPU's (without VNNI fbgemm's
    u8 x s8 pair sums saturate more: docs/backends.md), and whatever it narrowed was re-checked."""
    assert activations is not None and activations.checked and activations.bits == 8
    return activations.kernels


def test_the_report_checks_its_activations_and_a_user_base_keeps_its_own() -> None:
    torch.manual_seed(0)
    model, batches = Blocks().eval(), [torch.randn(4, 3, 8, 8) for _ in range(2)]
    # the check quantizes the config for real: verification runs it, an unverified report says it did not
    verified = qinsight.diagnose(model, batches)
    assert _checked_kernels(verified.fx_activations) == 4  # the static ones
    unverified = qinsight.diagnose(model, batches, verify=False)
    assert unverified.fx_activations == FxActivations(checked=False)
    assert "clip-aware (the backend's kernels not checked for saturation" in qinsight.to_text(unverified)
    report = saturation.kernels_checked(model, unverified, batches[0])  # the check alone, the config unverified
    dynamic = {s.fqn for s in report.suggestions if s.activation is qinsight.types.ActivationMode.DYNAMIC}
    assert dynamic == {"fc"} and _checked_kernels(report.fx_activations) == 4
    assert (
        "qinsight.qconfig_mapping(report): FX activations at 8 bits, clip-aware (4 quantized kernels"
        in qinsight.to_text(report)
    )
    assert qinsight.qconfig_mapping(report).global_qconfig.activation.p.keywords == {"reduce_range": False}  # type: ignore[union-attr]
    base = get_default_qconfig_mapping("x86")
    mapped = qinsight.qconfig_mapping(report, base=base)
    assert mapped.global_qconfig.activation.p.keywords == {"reduce_range": True}  # type: ignore[union-attr]
    assert not any(
        isinstance(q.activation(), ClippedHistogramObserver) for q in mapped.module_name_qconfigs.values() if q
    )
    onednn = qinsight.diagnose(model, batches, deploy="onednn", verify=False)  # 8 bits by default, but before the clips
    onednn = saturation.kernels_checked(model, onednn, batches[0])
    assert _checked_kernels(onednn.fx_activations) == 4
    assert any(
        isinstance(q.activation(), ClippedHistogramObserver)
        for q in qinsight.qconfig_mapping(onednn).module_name_qconfigs.values()
        if q
    )
    exported = torch.export.export(model, (batches[0],)).module()
    assert qinsight.diagnose(exported, batches).fx_activations is None  # PT2E observes 8 bits after the clips


@pytest.mark.parametrize("backend", ["onednn", "fbgemm"])
def test_the_check_runs_the_backends_own_kernels_and_restores_the_engine(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a converted model packs its weights for the engine set at conversion and runs its kernels
    torch.manual_seed(0)
    model, batch = Blocks().eval(), torch.randn(2, 3, 8, 8)
    sites = fx_view(model, None, batch).sites
    engines: list[str] = []
    checked = saturation.saturated

    def recording(converted: nn.Module, example: object) -> tuple[dict[str, float], int]:
        engines.append(torch.backends.quantized.engine)
        return checked(converted, example)

    monkeypatch.setattr(saturation, "saturated", recording)
    before = torch.backends.quantized.engine
    found = checked_activations(model, batch, backend, lambda a: advice_mapping(sites, (), backend, None, a))
    assert found is not None and found.kernels == 5  # the convs and the Linear, static
    assert engines and set(engines) == {backend} and torch.backends.quantized.engine == before


def test_a_model_on_an_accelerator_is_not_copied_to_be_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # FX's quantized kernels run on the CPU alone: the check would copy the model twice on the device,
    # trace, prepare and calibrate it, then fail at conversion. It answers at once (the report's FX
    # config then keeps torch's activations). A meta-device model stands for a GPU one here.
    copies = []
    monkeypatch.setattr(saturation, "hookless_copy", lambda model: copies.append(model) or model)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).to("meta")
    found = checked_activations(
        model, torch.randn(2, 8, device="meta"), "x86", lambda a: advice_mapping((), (), "x86", None, a)
    )
    assert found is None and copies == []


def test_the_checks_copy_the_modules_but_not_the_weights_and_leave_them_as_they_were() -> None:
    # report() quantizes copies of the model (the saturation and equalization checks); the copies share
    # the weights (a deep copy of four 7B-width layers took seconds) and never write into them
    from qinsight.frontends import shared_copy

    torch.manual_seed(0)
    model, batches = Blocks().eval(), [torch.randn(4, 3, 8, 8) for _ in range(2)]
    copied = shared_copy(model)
    assert copied.fc is not model.fc and copied.fc.weight is model.fc.weight
    assert copied.stem[1].running_mean is not model.stem[1].running_mean  # a forward may update a buffer
    before = {name: (tensor, tensor.clone()) for name, tensor in model.state_dict(keep_vars=True).items()}
    report = qinsight.diagnose(model, batches)
    assert _checked_kernels(report.fx_activations) == 4  # the check ran (conv-BN fused, converted)
    after = model.state_dict(keep_vars=True)
    assert after.keys() == before.keys()
    for name, (tensor, values) in before.items():
        assert after[name] is tensor and torch.equal(tensor, values), name


@pytest.mark.slow  # the whole suite's tier (test_a_kernel_that_saturates_at_eight_bits_reads_its_input_at_seven)
def test_the_check_keeps_dynamic_layers_in_float_and_finds_what_the_whole_config_finds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MobileNetV2, whose depthwise convs saturate at 8 bits, with its classifier dynamic: the check
    quantizes the static kernels alone (the dynamic one's input is float either way), and narrows the
    same inputs with the same excess as a check of the whole config."""
    from torch.ao.quantization import default_dynamic_qconfig

    from qinsight.examples.mobilenet import MobileNetV2

    torch.manual_seed(0)
    model, batch = MobileNetV2().eval(), torch.randn(2, 3, 96, 96)
    sites = fx_view(model, None, batch).sites

    def mapping(activations: FxActivations) -> Any:
        return advice_mapping(sites, (), "x86", None, activations).set_module_name(
            "classifier.1", default_dynamic_qconfig
        )

    kinds: list[set[str]] = []
    checked = saturation.saturated

    def recording(converted: nn.Module, example: object) -> tuple[dict[str, float], int]:
        kinds.append({type(m).__module__ for m in converted.modules()})
        return checked(converted, example)

    monkeypatch.setattr(saturation, "saturated", recording)
    static = checked_activations(model, batch, "x86", mapping)
    assert kinds and not any(".dynamic" in kind for found in kinds for kind in found)
    monkeypatch.setattr(saturation, "static_only", lambda m: m)
    kinds.clear()
    whole = checked_activations(model, batch, "x86", mapping)
    assert any(".dynamic" in kind for found in kinds for kind in found)  # the classifier, quantized dynamically
    assert static is not None and static.narrowed and static == whole


@settings(max_examples=examples(60), deadline=None)
@given(
    rows=st.integers(1, 20),
    features=st.integers(1, 40),
    outputs=st.integers(1, 12),
    zero_point=st.integers(0, 255),
    per_channel=st.booleans(),
    seed=st.integers(0, 2**16),
)
@example(
    rows=1, features=1, outputs=2, zero_point=0, per_channel=False, seed=0
)  # torch's _int_mm is wrong at one feature
def test_the_checks_integer_product_is_the_exact_product_of_the_quantized_values(
    rows: int, features: int, outputs: int, zero_point: int, per_channel: bool, seed: int
) -> None:
    # the check compares each quantized Linear with the exact result of its integers: computed in int32
    # (25x faster than in float at 7B widths), it must be the float64 product of the dequantized values
    import torch.ao.nn.quantized as nnq

    generator = torch.Generator().manual_seed(seed)
    x = torch.quantize_per_tensor(torch.randn(rows, features, generator=generator), 0.05, zero_point, torch.quint8)
    weight = torch.randn(outputs, features, generator=generator)
    if per_channel:
        scales = weight.abs().amax(dim=1) / 127 + 1e-6
        q = torch.quantize_per_channel(weight, scales.double(), torch.zeros(outputs, dtype=torch.long), 0, torch.qint8)
    else:
        q = torch.quantize_per_tensor(weight, float(weight.abs().max()) / 127 + 1e-6, 0, torch.qint8)
    bias = torch.randn(outputs, generator=generator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates its quantized tensors
        module = nnq.Linear(features, outputs)
        module.set_weight_bias(q, bias)
    exact = saturation._exact(module, x)
    reference = F.linear(x.dequantize().double(), q.dequantize().double(), bias.double()).float()
    assert exact.shape == reference.shape and torch.allclose(exact, reference, rtol=1e-6, atol=1e-6)
    # 3-D inputs (batch, tokens, features), as a decoder's Linears take them
    assert torch.equal(saturation._exact(module, x.reshape(1, rows, features)), exact.reshape(1, rows, outputs))
