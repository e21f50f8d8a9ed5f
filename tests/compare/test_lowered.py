"""compare_lowered: a PT2E model lowered as the user ships it (XNNPACK through ExecuTorch, x86 through
inductor), measured against its reference, per layer, and for latency and size."""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from typing import Any

import pytest
import torch
from torch import fx, nn

import qinsight
from qinsight.core.errors import InvalidParameterError, MissingExtraError
from qinsight.outputs.html import save_html
from qinsight.outputs.serde import load_report, save_report

pytest.importorskip("torchao")
xnnpack = pytest.importorskip("executorch.backends.xnnpack.quantizer.xnnpack_quantizer")


class Net(nn.Module):
    """Enough weights that int8 storage shows in the program's size; an add and a pool between the layers."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.body = nn.Conv2d(32, 32, 3, padding=1)
        self.head = nn.Linear(32, 64)
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = self.body(x) + x
        return self.out(torch.relu(self.head(x.mean((2, 3)))))


def _batches(count: int, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(4, 3, 16, 16, generator=generator) for _ in range(count)]


def _reference(model: nn.Module, quantizer: Any, calibration: list[torch.Tensor]) -> fx.GraphModule:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(torch.export.export(copy.deepcopy(model), (calibration[0],)).module(), quantizer)
    for batch in calibration:
        prepared(batch)
    converted: fx.GraphModule = convert_pt2e(prepared)
    return converted


def _xnnpack() -> Any:
    return xnnpack.XNNPACKQuantizer().set_global(xnnpack.get_symmetric_quantization_config(is_per_channel=True))


@pytest.fixture(scope="module")
def net() -> nn.Module:
    torch.manual_seed(0)
    return Net().eval()


@pytest.fixture(scope="module")
def xnnpack_lowered(net: nn.Module) -> qinsight.LoweredComparison:
    reference = _reference(net, _xnnpack(), _batches(4, seed=0))
    return qinsight.compare_lowered(net, reference, _batches(3, seed=1), backend="xnnpack", layer_batches=3)


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_the_xnnpack_program_is_measured_against_its_reference_and_the_float_model(
    xnnpack_lowered: qinsight.LoweredComparison,
) -> None:
    lowered = xnnpack_lowered
    assert lowered.runtime.startswith("ExecuTorch 1.5.1") and lowered.batches == 3
    # the int8 program is quantization away from float, as the reference is; both measured, not copied
    assert 15.0 < lowered.metric("lowered_vs_float") < 60.0
    assert 15.0 < lowered.metric("reference_vs_float") < 60.0
    assert lowered.metric("lowered_vs_reference") > lowered.metric("reference_vs_float")
    # the .pte holds int8 weights: about a quarter of the float program's bytes
    assert lowered.float_program is not None and lowered.size_ratio is not None
    assert 0.2 < lowered.size_ratio < 0.5
    assert lowered.program.latency_ms > 0.0 and lowered.float_program.latency_ms > 0.0


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_every_quantized_layer_and_op_is_lowered_alone_and_within_a_step_of_its_reference(
    xnnpack_lowered: qinsight.LoweredComparison,
) -> None:
    names = {layer.fqn for layer in xnnpack_lowered.layers}
    assert {"stem", "body", "head", "out"} <= names
    assert any(layer.kind == "add" for layer in xnnpack_lowered.layers)  # the residual add, an op site
    for layer in xnnpack_lowered.layers:
        # XNNPACK's integer kernels round where the reference rounds in float: one step at most
        assert layer.max_steps is not None and layer.max_steps <= 1.01, layer
        assert layer.sqnr > 35.0 and layer.mismatched < 0.05
    worst = xnnpack_lowered.worst(count=None)
    assert [layer.sqnr for layer in worst] == sorted(layer.sqnr for layer in worst)


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_the_lowered_kernels_inside_the_reference_reproduce_the_programs_output(
    xnnpack_lowered: qinsight.LoweredComparison,
) -> None:
    # the model's output is the last Linear's: with every kernel lowered in place (on all three batches,
    # as the program), its propagated gap is the whole program's
    last = xnnpack_lowered.layer("out")
    whole = xnnpack_lowered.metric("lowered_vs_reference")
    assert math.isinf(last.propagated) == math.isinf(whole)
    if math.isfinite(whole):
        assert abs(last.propagated - whole) < 3.0


class _SevenBitBody:
    """XNNPACKQuantizer, then ``body``'s output narrowed to 7 bits [-64, 63] (fbgemm's reduce_range
    habit, in a quantizer of one's own): the reference clamps there, XNNPACK's int8 kernels do not."""

    def __init__(self) -> None:
        from torchao.quantization.pt2e.quantizer import Quantizer

        self.inner = _xnnpack()
        self.__class__ = type("SevenBitBody", (_SevenBitBody, Quantizer), {})

    def transform_for_annotation(self, model: fx.GraphModule) -> fx.GraphModule:
        result: fx.GraphModule = self.inner.transform_for_annotation(model)
        return result

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        from qinsight.frontends import module_name_of

        self.inner.annotate(model)
        for node in model.graph.nodes:
            annotation = node.meta.get("quantization_annotation")
            if (
                node.target == torch.ops.aten.conv2d.default
                and module_name_of(node) == "body"
                and annotation is not None
            ):
                annotation.output_qspec = dataclasses.replace(annotation.output_qspec, quant_min=-64, quant_max=63)
        return model

    def validate(self, model: fx.GraphModule) -> None:
        self.inner.validate(model)


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_a_planted_departure_is_named_by_its_layer(net: nn.Module) -> None:
    reference = _reference(net, _SevenBitBody(), _batches(4, seed=0))
    # held-out inputs twice as large: body's output exceeds its 7-bit range, which only the reference clamps
    lowered = qinsight.compare_lowered(
        net, reference, _batches(2, seed=1, scale=2.0), backend="xnnpack", float_program=False
    )
    worst = lowered.worst(count=None)
    assert worst[0].fqn == "body"
    assert worst[0].max_steps is not None and worst[0].max_steps > 10.0
    assert all(layer.max_steps is not None and layer.max_steps <= 1.01 for layer in worst[1:]), worst
    # the departure enters the model there: the layer before it propagates none of it
    assert worst[0].sqnr < 30.0 and worst[0].propagated < 30.0
    assert lowered.layer("stem").propagated > 60.0
    assert lowered.float_program is None and lowered.speedup is None


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_a_lowered_comparison_is_kept_in_the_report_file_and_shown(
    xnnpack_lowered: qinsight.LoweredComparison, tmp_path: Any
) -> None:
    report = qinsight.comparison_report(
        qinsight.Comparison(quantized="convert_pt2e (XNNPACKQuantizer)", lowered=xnnpack_lowered)
    )
    path = tmp_path / "lowered.json"
    save_report(report, path)
    loaded = load_report(path)
    assert loaded.comparison is not None and loaded.comparison.lowered == xnnpack_lowered
    text = qinsight.to_text(loaded)
    assert "Lowered for xnnpack (ExecuTorch 1.5.1" in text
    worst = xnnpack_lowered.worst(count=1)[0]
    assert f"  {worst.fqn} " in text.split("Lowered kernels vs the reference")[1]
    html = tmp_path / "lowered.html"
    save_html(loaded, html)
    assert "Lowered kernels vs the reference" in html.read_text()


def test_what_cannot_be_lowered_says_what_to_change(net: nn.Module) -> None:
    from _peers import quantize
    from torch.ao.quantization import get_default_qconfig_mapping

    batches = _batches(2, seed=0)
    fx_model = quantize(net, get_default_qconfig_mapping("x86"), batches)
    with pytest.raises(InvalidParameterError, match="convert_pt2e"):
        qinsight.compare_lowered(net, fx_model, batches)
    reference = _reference(net, _xnnpack(), batches)
    with pytest.raises(InvalidParameterError, match="one shape"):
        qinsight.compare_lowered(net, reference, [batches[0], torch.randn(2, 3, 16, 16)], layers=False)
    with pytest.raises(InvalidParameterError, match="one whose program qinsight lowers: .*x86, xnnpack"):
        qinsight.compare_lowered(net, reference, batches, backend="qnnpack")
    with pytest.raises(InvalidParameterError, match="at least one batch"):
        qinsight.compare_lowered(net, reference, [])


@pytest.mark.slow  # ExecuTorch or a command's subprocesses: tens of seconds, the whole suite's tier
def test_a_model_quantized_on_small_batches_is_compared_on_larger_ones(net: nn.Module) -> None:
    """What a user does: quantize as a report advises on batches of 2, lower and compare on batches of
    8. The batch dimension is exported dynamic; from batches of 1 (which torch fixes), one line says so."""
    pairs = [torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed)) for seed in range(3)]
    report = qinsight.diagnose(net, pairs, backend="xnnpack")
    larger = _batches(2, seed=5) + [torch.randn(8, 3, 16, 16)]
    eights = [torch.cat([larger[0], larger[1]])]
    lowered = qinsight.compare_lowered(net, qinsight.quantize(net, report, pairs), eights, layers=False)
    assert lowered.batches == 1 and 10.0 < lowered.metric("reference_vs_float") < 60.0
    singles = [batch[:1] for batch in pairs]
    with pytest.raises(InvalidParameterError, match=r"exported for \(1, 3, 16, 16\).*batches of 2 or more"):
        qinsight.compare_lowered(net, qinsight.quantize(net, report, singles), eights, layers=False)


def test_without_executorch_one_error_names_the_extra(net: nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = _batches(2, seed=0)
    reference = _reference(net, _xnnpack(), batches)
    monkeypatch.setitem(sys.modules, "executorch.exir", None)  # import fails as if it were not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'qinsight\[executorch\]'"):
        qinsight.compare_lowered(net, reference, batches)


@pytest.mark.slow
def test_x86_is_lowered_by_inductor_and_measured_alike(net: nn.Module) -> None:
    from qinsight.backends.x86 import default_x86_quantizer

    reference = _reference(net, default_x86_quantizer(), _batches(4, seed=0))
    lowered = qinsight.compare_lowered(net, reference, _batches(2, seed=1), backend="x86")
    assert "inductor" in lowered.runtime and lowered.backend == "x86"
    assert {"stem", "body", "head", "out"} <= {layer.fqn for layer in lowered.layers}
    assert 10.0 < lowered.metric("reference_vs_float") < 60.0
    assert math.isfinite(lowered.metric("lowered_vs_float"))
    # the last Linear's output is the model's: the lowered kernels in place give the program's gap
    assert abs(lowered.layer("out").propagated - lowered.metric("lowered_vs_reference")) < 3.0
    assert lowered.size_ratio is not None and lowered.size_ratio < 0.5
