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
from qinsight.planning.scores import Scorer, Verdict
from qinsight.planning.simulated_flows import flow_for
from qinsight.planning.sweep import Tried, greedy, sweep
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
        modes, tried = greedy(sim, start, moves, data, score, accept, applies)
        found[budget] = modes, [(t.move, t.score, t.kept) for t in tried]
    sim.memory_budget = simulate.MEMORY_BUDGET
    modes = dict(start)
    one_by_one: list[tuple[Any, float | None, bool]] = []
    for move in moves:  # as a plan decided before sweeps: one whole run per move
        if not applies(modes, move):
            one_by_one.append((move, None, False))
            continue
        value = score(sweep(sim, {**modes, move[0]: move[1]}, [], data, list)[0])
        one_by_one.append((move, value, accept(value)))
        modes = {**modes, move[0]: move[1]} if accept(value) else modes
    assert found[1 << 40] == found[1] == (modes, one_by_one)


def _refinement(
    sim: simulate.Simulation, data: list[Any], metric: str, bar: float, seed: int, settles: bool
) -> tuple[dict[str, Mode], list[Tried[Verdict]], float, list[tuple[Verdict, float]]]:
    """Every site taken to static in a random order on top of all in float, kept where ``metric`` stays at
    ``bar`` or better (``settles``: a move stopped once its miss is certain); its forwards, and each move
    run on every batch: its verdict and its score."""
    moves = [(site, Mode.STATIC) for site in sim.sites]
    moves = [moves[i] for i in torch.randperm(len(moves), generator=torch.Generator().manual_seed(seed))]
    start = {site: Mode.FLOAT for site in sim.sites}
    scorer = Scorer(sweep(sim, start, [], data, list)[0], metric, metric)
    whole: list[tuple[Verdict, float]] = []

    def met(value: float) -> bool:
        return value >= bar

    def verdict(outputs: list[Any]) -> Verdict:
        found = scorer.verdict(outputs, met)
        whole.append((found, scorer(outputs)))
        return found

    before = sim.evaluations
    modes, tried = greedy(
        sim,
        start,
        moves,
        data,
        verdict,
        lambda found: met(found[0]),
        lambda modes, move: bool(modes[move[0]] is not move[1]),
        settle=(lambda outputs: scorer.settled(outputs, met)) if settles else None,
    )
    return modes, tried, sim.evaluations - before, whole


@settings(max_examples=6, deadline=None)
@given(
    bar=st.floats(min_value=0.0, max_value=1.0),
    seed=st.integers(0, 2**16),
    metric=st.sampled_from(("sqnr", "top1")),
    held=st.booleans(),
)
@hypothesis_example(bar=0.5, seed=0, metric="sqnr", held=True)
def test_a_move_refused_on_its_first_batches_is_the_record_all_of_them_give(
    cnn_simulation: tuple[simulate.Simulation, list[Any]], bar: float, seed: int, metric: str, held: bool
) -> None:
    """A refinement that stops running a move once its miss is certain (its score with the batches not
    run as the float model's own misses already) keeps and refuses every move alike, held or windowed,
    and records each as the one that ran every batch does: a miss by where it was certain first, its
    best case there at least its score on every batch."""
    sim, data = cnn_simulation
    sim.memory_budget = 1 << 40 if held else 1
    threshold = 37.0 + 15.0 * bar if metric == "sqnr" else 0.95 + 0.05 * bar  # the CNN's all-int8: 37.2 dB, 0.953
    modes, tried, _, whole = _refinement(sim, data, metric, threshold, seed, settles=False)
    settled_modes, settling, _, _ = _refinement(sim, data, metric, threshold, seed, settles=True)
    sim.memory_budget = simulate.MEMORY_BUDGET
    assert settled_modes == modes and settling == tried
    for (best, batches), score in whole:
        assert (best, batches) == (score, 0) if batches == 0 else best >= score and best < threshold
        assert 0 <= batches < len(data)


@pytest.mark.parametrize(("metric", "bar"), [("sqnr", 50.0), ("top1", 0.99)])
def test_moves_that_miss_stop_early_and_save_forwards(
    cnn_simulation: tuple[simulate.Simulation, list[Any]], metric: str, bar: float
) -> None:
    sim, data = cnn_simulation
    *_, whole, _ = _refinement(sim, data, metric, bar, 0, settles=False)
    _, settling, cheaper, _ = _refinement(sim, data, metric, bar, 0, settles=True)
    stopped = [t.score[1] for t in settling if t.score is not None and t.score[1]]
    assert stopped and max(stopped) < len(data) and not any(t.kept for t in settling if t.score and t.score[1])
    assert cheaper < whole
