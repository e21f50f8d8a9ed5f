"""The float model runs in the quantized models' memory layout (channels-last after x86 quantized convs),
and in its own where it cannot."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _data import gaussian_batches
from _models import ConvBnReluCNN, seeded
from _peers import quantized_fx
from torch import nn

import qinsight
from qinsight.compare import accumulate


def layouts_seen(model: nn.Module) -> list[bool]:
    """Whether each input ``model``'s first conv is called with is channels-last (a hook's record)."""
    seen: list[bool] = []
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    conv.register_forward_pre_hook(lambda _m, args: seen.append(not args[0].is_contiguous()))
    return seen


def test_the_float_model_runs_channels_last_and_compares_as_in_its_own_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    model, data = seeded(ConvBnReluCNN()), gaussian_batches((4, 3, 16, 16), 3)
    _, converted = quantized_fx(model, data)
    seen = layouts_seen(model)
    ours = qinsight.compare_activations(model, converted, data)
    # x86 quantized convs write channels-last: the float model ran so too on every batch (the first of
    # its runs finds the ops to compare, before the quantized models have run)
    assert seen == [False] + [True] * 3
    monkeypatch.setattr(accumulate.KeptOutputs, "mostly_channels_last", lambda _self: False)
    plain = qinsight.compare_activations(model, converted, data)
    assert seen[4:] == [False] * 4
    assert [row.fqn for row in ours.rows] == [row.fqn for row in plain.rows]
    for row, same in zip(ours.rows, plain.rows):
        for local in (False, True):  # float convs in the other layout round otherwise: 1e-6 of the values
            assert row.metric("sqnr", local=local) == pytest.approx(same.metric("sqnr", local=local), abs=1e-3), row.fqn
        assert row.batches == same.batches == 3


class ViewsItsInput(nn.Module):
    """Reads its input with ``view``, which a channels-last tensor does not allow (the quantized
    model, fed the batch as given, runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(3 * 8 * 8, 8)

    def forward(self, x: torch.Tensor) -> Any:
        return self.conv(x).mean(dim=(2, 3)) + self.fc(x.view(x.shape[0], -1))


def test_a_float_model_that_cannot_run_channels_last_is_compared_in_its_own_layout() -> None:
    model, data = seeded(ViewsItsInput()), gaussian_batches((4, 3, 8, 8), 3)
    _, converted = quantized_fx(model, data)
    with pytest.raises(RuntimeError, match="view size"):
        model(data[0].contiguous(memory_format=torch.channels_last))
    comparison = qinsight.compare_activations(model, converted, data)
    assert {row.fqn: row.batches for row in comparison.layers} == {"conv": 3, "fc": 3}  # the failed try not counted
    again = qinsight.compare_activations(model, converted, data)  # a second call starts afresh
    assert [row.metric("sqnr") for row in again.rows] == [row.metric("sqnr") for row in comparison.rows]
    assert all(math.isfinite(row.metric("sqnr")) for row in comparison.rows)
