"""The comparison takes the float output where the quantized layer ends: after the activations it
absorbed, modules (nn.ReLU) and functional calls (F.relu, torch.relu) alike, in FX and PT2E."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _data import gaussian_batches
from _models import seeded
from _peers import quantized_fx
from torch import nn

import qinsight


class Activations(nn.Module):
    """One Linear before each way of writing an activation, and a gated MLP whose ``down`` reads F.relu."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_functional = nn.Linear(16, 32)
        self.fc_torch = nn.Linear(32, 32)
        self.fc_module = nn.Linear(32, 32)
        self.relu = nn.ReLU()
        self.fc_relu6 = nn.Linear(32, 32)
        self.relu6 = nn.ReLU6()
        self.fc_hardtanh = nn.Linear(32, 32)
        self.gate = nn.Linear(32, 64)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc_functional(x))
        x = torch.relu(self.fc_torch(x))
        x = self.relu(self.fc_module(x))
        x = self.relu6(self.fc_relu6(x))
        x = F.hardtanh(self.fc_hardtanh(x), -0.5, 0.5)
        out: torch.Tensor = self.down(F.relu(self.gate(x)) * self.up(x))
        return out


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    model = seeded(Activations())
    for p in model.parameters():  # well-scaled activations: every layer keeps tens of dB when compared right
        nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    return model.eval()


CALIBRATION = gaussian_batches((32, 16), 4)
HELD_OUT = gaussian_batches((32, 16), 3, seed=1)
ABSORBING = ("fc_functional", "fc_torch", "fc_module", "gate")


def check(comparison: qinsight.ActivationComparison, absorbed_at: dict[str, str]) -> None:
    # Measured: 25-40 dB everywhere when the float side is taken after the ReLU the quantized layer
    # absorbed; taken before it (the bug), the absorbing layers read 0.2-4 dB.
    for layer in comparison.layers:
        assert layer.metric("sqnr", local=True) > 20.0, layer.fqn
        assert layer.metric("sqnr") > 15.0, layer.fqn
    for fqn, at in absorbed_at.items():
        assert comparison.layer(fqn).compared_at == at


def test_fx_compares_after_the_relu_it_fused(model: nn.Module) -> None:
    quantized = quantized_fx(model, CALIBRATION)[1]
    fused = {fqn: type(quantized.get_submodule(fqn)).__name__ for fqn in ABSORBING}
    # F.relu fuses as nn.ReLU does; torch.relu does not (FX runs it in float, after a dequantize)
    assert fused == {
        "fc_functional": "LinearReLU",
        "fc_torch": "Linear",
        "fc_module": "LinearReLU",
        "gate": "LinearReLU",
    }
    comparison = qinsight.compare_activations(model, quantized, HELD_OUT)
    check(
        comparison,
        {
            "fc_functional": "fc_functional+relu",
            "fc_torch": "fc_torch",
            "fc_module": "relu",
            "gate": "gate+relu",
            "fc_relu6": "fc_relu6",  # FX quantizes ReLU6 and hardtanh on their own
            "fc_hardtanh": "fc_hardtanh",
        },
    )


def test_pt2e_compares_after_the_activation_its_chain_ends_with(model: nn.Module) -> None:
    xiq = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    exported = torch.export.export(copy.deepcopy(model), (CALIBRATION[0],)).module()
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    for batch in CALIBRATION:
        prepared(batch)
    comparison = qinsight.compare_activations(model, convert_pt2e(prepared), HELD_OUT)
    check(
        comparison,
        {"fc_functional": "fc_functional+relu", "fc_torch": "fc_torch+relu", "fc_module": "relu", "gate": "gate+relu"},
    )


def test_the_float_side_before_the_relu_was_the_bug(model: nn.Module) -> None:
    # The same quantized output against the float *pre*-ReLU output: what the comparison used to measure.
    quantized = quantized_fx(model, CALIBRATION)[1]
    pre, post, out = [], [], []
    model.gate.register_forward_hook(lambda _m, _a, o: pre.append(o))
    quantized.get_submodule("gate").register_forward_hook(lambda _m, _a, o: out.append(o.dequantize()))
    with torch.no_grad():
        model(HELD_OUT[0]), quantized(HELD_OUT[0])
    model.gate._forward_hooks.clear()
    post = [F.relu(p) for p in pre]

    def sqnr(ref: torch.Tensor, got: torch.Tensor) -> float:
        return float(10 * torch.log10(ref.pow(2).sum() / (ref - got).pow(2).sum()))

    assert sqnr(pre[0], out[0]) < 6.0 < 20.0 < sqnr(post[0], out[0])
