"""The exported-graph frontend: torch.export programs, their modules and prepare_pt2e graphs,
with the same verdicts as the FX and eager frontends."""

from __future__ import annotations

import collections
import copy
import warnings

import attrs
import pytest
import torch
import torch.nn.functional as F
from _data import gaussian_batches
from _models import MLP, ConvBnReluCNN, TwiceLinear, seeded
from _real import mobilenet_v2_or_skip
from torch import nn

import qinsight
from qinsight.detectors import PerChannelFinding
from qinsight.errors import FrontendError
from qinsight.examples import example
from qinsight.types import OpKind, Side, WeightScheme


def exported(model: nn.Module, batch: torch.Tensor) -> torch.fx.GraphModule:
    module: torch.fx.GraphModule = torch.export.export(copy.deepcopy(model), (batch,)).module()
    return module


def same_everywhere(model: nn.Module, data: list[torch.Tensor]) -> qinsight.Report:
    # what the detectors find, not what each frontend's own flow verifies of it (PT2E, FX, none)
    reports = {
        "export": qinsight.diagnose(exported(model, data[0]), data, verify=False),
        "fx": qinsight.diagnose(copy.deepcopy(model), data, frontend="fx", verify=False),
        "eager": qinsight.diagnose(copy.deepcopy(model), data, frontend="eager", verify=False),
    }
    assert {name: r.metadata.frontend for name, r in reports.items()} == {
        "export": "export",
        "fx": "fx",
        "eager": "eager",
    }
    reference = reports["fx"]
    for report in (reports["export"], reports["eager"]):
        assert [(s.fqn, s.kind, s.calls, s.groups, s.axis) for s in report.sites] == [
            (s.fqn, s.kind, s.calls, s.groups, s.axis) for s in reference.sites
        ]
        # Which ops are quantized is the flow's: PT2E's X86InductorQuantizer leaves LayerNorm float, FX does
        # not. So the exported report agrees with FX's on the layers and on the ops both quantize.
        both = {s.fqn for s in report.sites if s.quantized} & {s.fqn for s in reference.sites if s.quantized}
        assert [(r.detector, r.parameters, tuple(f for f in r.findings if f.fqn in both)) for r in report.results] == [
            (r.detector, r.parameters, tuple(f for f in r.findings if f.fqn in both)) for r in reference.results
        ]
        assert tuple(s for s in report.suggestions if s.fqn in both) == tuple(
            s for s in reference.suggestions if s.fqn in both
        )
        assert tuple(o for o in report.observations if o.fqn in both) == tuple(
            o for o in reference.observations if o.fqn in both
        )
    assert reports["eager"].results == reference.results
    # what feeds a site and which clip reads it are read from FX's graph only
    assert reports["eager"].sites == tuple(attrs.evolve(s, source=None, clip=None) for s in reference.sites)
    return reports["export"]


@pytest.mark.parametrize("name", ["mlp", "cnn", "twice", "encoder"])
def test_same_verdicts_as_fx_and_eager(name: str) -> None:
    if name == "mlp":
        same_everywhere(seeded(MLP()), gaussian_batches((16, 16), 4))
    elif name == "cnn":
        same_everywhere(seeded(ConvBnReluCNN()), gaussian_batches((2, 3, 12, 12), 4))
    elif name == "twice":
        report = same_everywhere(seeded(TwiceLinear()), gaussian_batches((4, 8), 3))
        # a site per call, one weight: the second call's weight statistics are the first's
        assert [(s.fqn, s.occurrence) for s in report.sites if s.kind.is_layer] == [
            ("shared", 0),
            ("shared#1", 1),
            ("out", 0),
        ]
    else:
        chosen = example("encoder")
        same_everywhere(chosen.model(), chosen.data(4))


@pytest.mark.slow
def test_real_mobilenet_v2_same_verdicts() -> None:
    model = mobilenet_v2_or_skip()
    report = same_everywhere(model, gaussian_batches((2, 3, 224, 224), 2))
    layers = [s for s in report.sites if s.kind.is_layer]
    assert len(layers) == 53 and sum(s.groups > 1 for s in layers) == 17
    # the ops between them: 35 ReLU6 (hardtanh), 10 residual adds, the pooling
    kinds = collections.Counter(s.kind for s in report.sites if not s.kind.is_layer)
    assert kinds == {OpKind.HARDTANH: 35, OpKind.ADD: 10, OpKind.POOL: 1}


def test_exported_program_and_graph_left_unchanged() -> None:
    model, data = seeded(ConvBnReluCNN()), gaussian_batches((2, 3, 12, 12), 3)
    program = torch.export.export(copy.deepcopy(model), (data[0],))
    assert qinsight.diagnose(program, data).metadata.frontend == "export"
    module = program.module()
    code, before = module.code, module(data[0])
    names = {name for name, _ in module.named_modules()}
    qinsight.diagnose(module, data)
    assert module.code == code and {name for name, _ in module.named_modules()} == names
    assert torch.equal(module(data[0]), before)


class Functional(nn.Module):
    """Linear layers applied with F.linear on the module's own parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(16, 8) * 0.3)
        self.proj = nn.Linear(16, 4)
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.w1)
        attended, _ = self.attention(h, h, h)
        out: torch.Tensor = self.proj(attended)
        return out


def test_functional_linears_and_attention_projections_are_sites() -> None:
    # torch's ModelReport sees neither F.linear layers nor attention's projections (PEER.md (c) 13).
    torch.manual_seed(0)
    model, data = Functional().eval(), gaussian_batches((2, 5, 8), 3)
    report = qinsight.diagnose(exported(model, data[0]), data)
    # a weight owned by the root module is named after itself: "w1"
    assert [s.fqn for s in report.sites] == ["w1", "attention", "attention.out_proj", "proj"]
    assert report.observation("attention", Side.PRE) is not None
    eager = qinsight.diagnose(copy.deepcopy(model), data, frontend="eager")
    assert [s.fqn for s in eager.sites] == ["proj"]  # eager sees modules only


def test_prepare_pt2e_graph() -> None:
    pytest.importorskip("torchao")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    model, data = seeded(ConvBnReluCNN()), gaussian_batches((2, 3, 12, 12), 4)
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported(model, data[0]), quantizer)
    code = prepared.code
    report = qinsight.diagnose(prepared, data)
    assert report.metadata.frontend == "export" and prepared.code == code
    assert [s.fqn for s in report.sites] == ["conv1", "block.0", "fc", "pool"]
    # The quantizer's weight observers are per channel: per-channel is "in use", read from the graph.
    assert all(s.weight_scheme is WeightScheme.PER_CHANNEL for s in report.sites if s.kind.is_layer)
    assert all(isinstance(f, PerChannelFinding) and f.used for f in report.result("qinsight.per_channel").findings)
    # BN is folded: the equalization detector reads the folded conv weight, not the float one.
    folded = report.result("qinsight.equalization").finding("conv1")
    float_conv = model.conv1.weight.detach().double()
    float_ranges = tuple((float_conv.amax(dim=(0, 2, 3)) - float_conv.amin(dim=(0, 2, 3))).tolist())
    assert folded.weight_ranges != pytest.approx(float_ranges)  # type: ignore[attr-defined]
    # torch's ModelReport fails on the same graph (PEER.md (d)).
    from torch.ao.quantization.fx._model_report.detector import OutlierDetector
    from torch.ao.quantization.fx._model_report.model_report import ModelReport

    with pytest.raises(ValueError, match="target_fqn not found"):
        ModelReport(copy.deepcopy(prepared), {OutlierDetector()}).prepare_detailed_calibration()


def test_export_frontend_on_a_non_exported_model_is_an_error() -> None:
    with pytest.raises(FrontendError, match="not an exported graph"):
        qinsight.diagnose(seeded(MLP()), [torch.randn(2, 16)], frontend="export")
