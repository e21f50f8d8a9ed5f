"""A sweep scores configurations batch by batch: what it holds at once is one batch's values, however
many batches it scores, and cutting it into turns (a budget for the outputs) changes no score."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from hypothesis import example as hypothesis_example
from hypothesis import given, settings
from hypothesis import strategies as st

import qinsight
from qinsight.examples import example
from qinsight.planning import simulate
from qinsight.planning.simulated_flows import flow_for
from qinsight.planning.sweep import greedy, sweep
from qinsight.planning.switches import Mode


@pytest.fixture(scope="module")
def cnn_simulation() -> tuple[simulate.Simulation, list[Any]]:
    chosen = example("cnn")
    model, data = chosen.model(), chosen.data(10)
    report = qinsight.diagnose(model, data[:2], deploy="fx", verify=False)
    sim = flow_for("fx", model, report.sites, "x86", data).simulation(data[:2])
    return sim, data[2:]


def _configs(sim: simulate.Simulation) -> tuple[dict[str, Mode], list[dict[str, Mode]]]:
    """Every site quantized, and each site floated alone from there."""
    quantized = {site: Mode.STATIC for site in sim.sites}
    return quantized, [{**quantized, site: Mode.FLOAT} for site in sim.sites]


def test_a_sweep_holds_one_batchs_values_however_many_batches_it_scores(
    cnn_simulation: tuple[simulate.Simulation, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim, data = cnn_simulation
    alive: set[int] = set()
    most = [0]
    made = simulate.BatchValues.__init__

    def counted(self: simulate.BatchValues, *args: Any) -> None:
        made(self, *args)
        alive.add(id(self))
        most[0] = max(most[0], len(alive))
        weakref.finalize(self, alive.discard, id(self))

    monkeypatch.setattr(simulate.BatchValues, "__init__", counted)
    base, configs = _configs(sim)
    held = {}
    for batches in (2, 8):
        most[0] = 0
        for chained in (False, True):
            sweep(sim, base, configs, data[:batches], lambda outputs: float(torch.cat(outputs).sum()), chained=chained)
        held[batches] = most[0]
    assert held[2] == held[8] <= 3  # the base's values or the config before, the one being made, and no more


@settings(max_examples=6, deadline=None)
@given(budget_configs=st.integers(min_value=1, max_value=5), chained=st.booleans())
def test_turns_change_no_score_and_cost_a_base_forward_each(
    cnn_simulation: tuple[simulate.Simulation, list[Any]], budget_configs: int, chained: bool
) -> None:
    sim, data = cnn_simulation
    base, configs = _configs(sim)
    start = sim.evaluations
    whole = sweep(sim, base, configs, data, list, chained=chained)
    middle = sim.evaluations
    one_config = sum(output.nbytes for output in whole[0])  # a config's outputs on every batch, in bytes
    cut = sweep(sim, base, configs, data, list, chained=chained, budget=budget_configs * one_config)
    turns = -(-len(configs) // budget_configs)
    assert all(torch.equal(a, b) for a, b in zip(whole[0], cut[0]))
    assert all(torch.equal(a, b) for x, y in zip(whole[1], cut[1]) for a, b in zip(x, y))
    extra = (sim.evaluations - middle) - (middle - start)
    assert extra == pytest.approx(turns - 1, abs=1e-6)  # each further turn runs its base again: one forward


@settings(max_examples=5, deadline=None)
@given(keep_share=st.floats(min_value=0.0, max_value=1.0), seed=st.integers(0, 2**16))
@hypothesis_example(keep_share=0.5, seed=0)  # some moves kept, some not
def test_greedy_moves_decide_alike_held_or_windowed_and_as_one_run_each(
    cnn_simulation: tuple[simulate.Simulation, list[Any]], keep_share: float, seed: int
) -> None:
    """A refinement's moves, each kept where its score passes a bar: held (the config's values for every
    batch fit the budget), windowed (they do not) and one whole run per move decide every move alike."""
    sim, data = cnn_simulation
    moves = [(site, mode) for site in sim.sites for mode in (Mode.STATIC, Mode.FLOAT)]
    moves = [moves[i] for i in torch.randperm(len(moves), generator=torch.Generator().manual_seed(seed))]
    start = {site: Mode.FLOAT for site in sim.sites}

    def score(outputs: list[Any]) -> float:
        return float(torch.cat(outputs).double().square().mean())

    reference = score(sweep(sim, start, [], data, list)[0])
    bar = reference * (1.0 + (keep_share - 0.5) * 0.02)

    def accept(value: float) -> bool:
        return value <= bar

    def applies(modes: Any, move: Any) -> bool:
        return bool(modes[move[0]] is not move[1])

    found = {}
    for budget in (1 << 40, 1):  # held, then windowed
        sim.memory_budget = budget
        found[budget] = greedy(sim, start, moves, data, score, accept, applies)
    sim.memory_budget = simulate.MEMORY_BUDGET
    modes, one_by_one = dict(start), []
    for move in moves:  # as a plan decided before sweeps: one whole run per move
        if not applies(modes, move):
            one_by_one.append((move, None, False))
            continue
        value = score(sweep(sim, {**modes, move[0]: move[1]}, [], data, list)[0])
        one_by_one.append((move, value, accept(value)))
        modes = {**modes, move[0]: move[1]} if accept(value) else modes
    assert found[1 << 40] == found[1] == (modes, one_by_one)
