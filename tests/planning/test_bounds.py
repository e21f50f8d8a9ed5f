"""The pessimistic bound a format plan holds its target to (``planning.scores.pessimistic_bound``)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from qinsight.planning.scores import pessimistic_bound

values = st.lists(st.floats(-50, 50, allow_nan=False), min_size=4, max_size=300).map(
    lambda v: torch.tensor(v, dtype=torch.float64)
)


@given(values, st.floats(0.5, 0.999), st.floats(-10, 10))
def test_the_bound_lies_on_the_worse_side_of_the_mean_and_moves_with_the_values(
    v: torch.Tensor, confidence: float, shift: float
) -> None:
    mean = float(v.mean())
    upper = pessimistic_bound(v, confidence, higher_is_better=False)
    lower = pessimistic_bound(v, confidence, higher_is_better=True)
    assert upper >= mean - 1e-9 and lower <= mean + 1e-9
    assert math.isclose(upper - mean, mean - lower, rel_tol=1e-6, abs_tol=1e-9)  # symmetric about the mean
    assert math.isclose(
        pessimistic_bound(v + shift, confidence, higher_is_better=False), upper + shift, rel_tol=1e-6, abs_tol=1e-6
    )
    assert pessimistic_bound(v, min(confidence + 0.0005, 0.9999), higher_is_better=False) >= upper - 1e-9


def test_correlated_neighbours_widen_the_bound_an_independent_one_would_miss() -> None:
    """Runs of equal values (one hard word spoils the next few) carry fewer independent values than
    tokens: the batch-means error sees it, a per-token standard error does not."""
    generator = torch.Generator().manual_seed(0)
    independent = torch.randn(400, generator=generator, dtype=torch.float64)
    runs = torch.randn(20, generator=generator, dtype=torch.float64).repeat_interleave(20)
    width = {
        name: pessimistic_bound(v, 0.95, higher_is_better=False) - float(v.mean())
        for name, v in (("iid", independent), ("runs", runs))
    }
    per_token = {
        name: 1.6449 * float(v.std()) / math.sqrt(v.numel()) for name, v in (("iid", independent), ("runs", runs))
    }
    assert width["iid"] == pytest.approx(per_token["iid"], rel=0.5)  # independent: about the same
    assert width["runs"] > 3 * per_token["runs"]  # runs of 20: about sqrt(20) wider


def test_too_few_values_give_no_bound() -> None:
    assert math.isnan(pessimistic_bound(torch.ones(3), 0.95, higher_is_better=False))
    assert pessimistic_bound(torch.full((9,), 2.0), 0.95, higher_is_better=True) == 2.0
