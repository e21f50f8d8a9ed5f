"""``qinsight.quantize``: the model the three-step recipe gives (prepare with the advice's config, calibrate,
convert), for a report and for a plan, in FX and PT2E, compared bit for bit on two models."""

from __future__ import annotations

import copy
import importlib.util
from typing import Any

import pytest
import torch
from _data import gaussian_batches
from _models import MLP, ConvBnReluCNN, seeded
from torch import nn
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight

FLOWS = [
    "fx",
    pytest.param("pt2e", marks=pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao")),
]


def three_steps(model: nn.Module, source: Any, calibration: list[torch.Tensor], flow: str) -> nn.Module:
    """What a user writes by hand: the advice's config, prepare, calibrate, convert."""
    if flow == "fx":
        prepared = prepare_fx(
            copy.deepcopy(model),
            qinsight.qconfig_mapping(source),
            (calibration[0],),
            _equalization_config=qinsight.equalization_config(source),
        )
    else:
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

        exported = torch.export.export(copy.deepcopy(model), (calibration[0],)).module()
        prepared = prepare_pt2e(exported, qinsight.pt2e_quantizer(source))
    with torch.no_grad():
        for batch in calibration:
            prepared(batch)
    if flow == "fx":
        return convert_fx(prepared)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    converted: nn.Module = convert_pt2e(prepared)
    return converted


MODELS = {
    "mlp": (lambda: seeded(MLP()), (8, 16)),
    "cnn": (lambda: seeded(ConvBnReluCNN()), (4, 3, 12, 12)),
}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_quantize_gives_the_model_of_the_three_step_recipe(name: str, flow: str) -> None:
    build, shape = MODELS[name]
    model = build()
    state = {key: value.clone() for key, value in model.state_dict().items()}
    calibration, held_out = gaussian_batches(shape, 4), gaussian_batches(shape, 2, seed=1)
    report = qinsight.diagnose(model, calibration)
    plan = qinsight.plan(model, calibration, held_out, goal="sqnr>=20", deploy=flow, report=report)
    for source in (report, plan, report.with_plan(plan)):
        ours = qinsight.quantize(model, source, calibration, flow=flow)
        theirs = three_steps(model, source, calibration, flow)
        with torch.no_grad():
            for batch in held_out:
                assert torch.equal(ours(batch), theirs(batch))
    assert all(
        torch.equal(value, state[key]) for key, value in model.state_dict().items()
    )  # the user's model untouched


def test_quantize_refuses_a_flow_it_does_not_know_in_one_line() -> None:
    model = seeded(MLP())
    report = qinsight.diagnose(model, gaussian_batches((8, 16), 2))
    with pytest.raises(qinsight.errors.InvalidParameterError, match="flow='eager' is invalid; expected 'fx' or 'pt2e'"):
        qinsight.quantize(model, report, gaussian_batches((8, 16), 2), flow="eager")
    with pytest.raises(qinsight.errors.InvalidParameterError, match="calibration_data"):
        qinsight.quantize(model, report, [])
