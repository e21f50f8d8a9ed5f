"""Configurations scored on every evaluation batch, batch by batch: a plan's memory bounded by a batch.

A plan scores hundreds of configurations of one simulation (:mod:`.simulate`), most of them a few
sites away from a configuration it ran already. Run config by config, each config's values had to be
kept for every batch for the next config to start from them, and a plan's memory grew with its data:
MobileNetV2 keeps 31 MB a 224² crop a configuration in PT2E (54 MB in FX), and a plan on 48 crops
peaked near 16 GB. A sweep turns the loops around. For each batch it runs the base configuration once and each
config from it (or, chained, from the config before it), recomputing only what a change reaches, and
drops the batch's values before the next batch: the values held at once are one batch's, of two
configurations. What a sweep keeps across batches is each config's output per batch (a model's final
outputs: a CNN's logits are 4 kB a crop), until the config is scored. Where the outputs of every
config would pass ``budget`` bytes (a language model's logits), the configs run in turns that fit,
each turn running its base again: one more forward a turn, never more memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs
import torch
from torch.utils import _pytree

from qinsight.planning.simulate import MEMORY_BUDGET, BatchValues, Simulation
from qinsight.planning.switches import Mode

T = TypeVar("T")
Modes = Mapping[str, Mode]
Progress = Callable[[int, int], None]  # batches done, batches in all
Settle = Callable[[list[Any]], T | None]  # a config's outputs on the batches so far -> its score, if decided


def sweep(
    sim: Simulation,
    base: Modes,
    configs: Sequence[Modes],
    batches: Sequence[object],
    score: Callable[[list[Any]], T],
    *,
    chained: bool = False,
    budget: int | None = None,
    progress: Progress | None = None,
    settle: Settle[T] | None = None,
) -> tuple[T, list[T]]:
    """``score`` of ``base``'s outputs on ``batches`` (one entry per batch) and of each config's, the
    configs run from ``base`` (``chained``: each from the config before it, the first from ``base``),
    batch by batch (the module docstring). The scores are those of running each config on every batch
    alone: a run from another recomputes what the change reaches, exactly. ``budget``: bytes of outputs
    held at once, default the simulation's (:attr:`Simulation.memory_budget`, the plan's ``memory_budget``).
    ``settle`` (configs not ``chained``): asked of a config's outputs on the batches run so far, a score
    where they decide it already (:func:`greedy`'s miss that the rest cannot mend): the config's score,
    and it runs no further batch."""
    budget = sim.memory_budget if budget is None else budget
    share = 1.0 / max(len(batches), 1)
    start, done = base, 0
    base_score: list[T] = []
    scores: list[T] = []
    tick = _ticks((len(configs) + 1) * len(batches), progress)  # runs of one config on one batch
    settle = None if chained else settle  # a chained config is the next one's start: it runs every batch
    while done < len(configs) or not base_score:
        turn, outputs, settled = _turn(sim, start, configs[done:], batches, share, chained, budget, tick, settle)
        if not base_score:
            base_score.append(score(outputs[0]))
        scores += [settled[slot] if slot in settled else score(found) for slot, found in enumerate(outputs[1:], 1)]
        done += len(outputs) - 1
        if chained and turn:
            start = turn[-1]
    return base_score[0], scores


def _turn(
    sim: Simulation,
    start: Modes,
    configs: Sequence[Modes],
    batches: Sequence[object],
    share: float,
    chained: bool,
    budget: int,
    tick: Callable[[], None],
    settle: Settle[T] | None,
) -> tuple[Sequence[Modes], list[list[Any]], dict[int, T]]:
    """As many of ``configs`` as ``budget`` holds the outputs of, run on every batch from ``start``: the
    configs run, the outputs per batch of ``start`` first, then of each config, and the scores of the
    configs ``settle`` decided before their last batch (by slot: 1 the first config)."""
    turn: Sequence[Modes] = configs
    outputs: list[list[Any]] = []
    settled: dict[int, T] = {}
    for index, batch in enumerate(batches):
        before = sim.values(start, batch, share)
        if index == 0:  # the outputs' size is known from the first batch: the turn takes what fits
            turn = configs[: _fitting(before.output, len(batches), budget)]
            outputs = [[] for _ in range(len(turn) + 1)]
        outputs[0].append(before.output)
        tick()
        for slot, modes in enumerate(turn, start=1):
            if slot in settled:
                tick()  # counted as run: the progress line's total stays the runs asked
                continue
            after: BatchValues = sim.changed(modes, before, share)
            outputs[slot].append(after.output)
            tick()
            if chained:
                before = after
            elif settle is not None and index + 1 < len(batches) and (found := settle(outputs[slot])) is not None:
                settled[slot] = found
    return turn, outputs, settled


def _ticks(runs: int, progress: Progress | None) -> Callable[[], None]:
    """What a sweep calls after each run of a config on a batch: ``progress`` told the runs done of
    ``runs`` (told 0 at once; a turn's base run again is not counted past ``runs``)."""
    done = [0]
    if progress is not None:
        progress(0, runs)

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(min(done[0], runs), runs)

    return tick


Move = tuple[str, Mode]  # a site, and the mode a step gives it


@attrs.frozen
class Tried(Generic[T]):
    """A move as :func:`greedy` tried it: its ``score`` (``None``: it did not apply) and whether it was ``kept``."""

    move: Move
    score: T | None
    kept: bool


def greedy(
    sim: Simulation,
    modes: Modes,
    moves: Sequence[Move],
    batches: Sequence[object],
    score: Callable[[list[Any]], T],
    accept: Callable[[T], bool],
    applies: Callable[[Modes, Move], bool],
    progress: Progress | None = None,
    settle: Settle[T] | None = None,
) -> tuple[dict[str, Mode], list[Tried[T]]]:
    """Each move tried in order alone on top of ``modes`` (where it ``applies`` to them), scored on every
    batch and kept where ``accept`` says, a kept move changing the config the later ones are tried on
    (a search's refinement). Returns the final modes and each move as tried.

    Each decision needs every batch's score, so the config the moves are tried on is needed for every
    batch at once. Where twice its values on every batch fit the simulation's budget, they are held, and
    each move recomputes only what it reaches (the cheapest way). Else moves are scored a window at a time
    from the config, batch by batch, its values computed again for each window: a kept move ends its
    window (the window's later moves run again), so the window follows the share of moves kept.

    ``settle``: asked of a move's outputs on its first batches (fewer than all), its score where they
    decide it already (:meth:`~qinsight.planning.scores.Scorer.settled`: a miss the other batches cannot
    mend); the move runs no further batch (most moves a refinement tries miss)."""
    if progress is not None:
        progress(0, len(moves))
    held = _held(sim, modes, batches)
    # how moves are scored on top of the current config: each class gives width, scores and keep
    trier: _HeldTrier[T] | _WindowTrier[T] = (
        _HeldTrier(sim, held, score, settle) if held is not None else _WindowTrier(sim, batches, score, settle)
    )
    current, queue = dict(modes), list(moves)
    tried: list[Tried[T]] = []
    decided = kept_count = 0
    while queue:
        window = queue[: trier.width(decided, kept_count)]
        apply = [applies(current, move) for move in window]
        trials = [{**current, site: mode} for (site, mode), applied in zip(window, apply) if applied]
        scores = iter(trier.scores(current, trials) if trials else ())  # none: nothing to run
        used = 0
        for move, applied in zip(window, apply):
            used += 1
            if not applied:
                tried.append(Tried(move, None, False))
                continue
            value = next(scores)
            kept = accept(value)
            decided, kept_count = decided + 1, kept_count + kept
            tried.append(Tried(move, value, kept))
            if kept:
                current = {**current, move[0]: move[1]}
                trier.keep()
                break
        queue = queue[used:]
        if progress is not None:
            progress(len(moves) - len(queue), len(moves))
    return current, tried


def _held(sim: Simulation, modes: Modes, batches: Sequence[object]) -> list[BatchValues] | None:
    """``modes`` run on every batch, its values held, where twice their bytes fit ``sim``'s budget."""
    share = 1.0 / max(len(batches), 1)
    first = sim.values(modes, batches[0], share)
    if not sim.agree(2 * _nbytes(first.values) * len(batches) <= sim.memory_budget):  # every rank holds, or none
        return None
    return [first, *(sim.values(modes, batch, share) for batch in batches[1:])]


class _HeldTrier(Generic[T]):
    """The config's values held for every batch: one move at a time, each recomputing what it reaches."""

    def __init__(
        self, sim: Simulation, held: list[BatchValues], score: Callable[[list[Any]], T], settle: Settle[T] | None
    ) -> None:
        self.sim, self.held, self.score, self.settle = sim, held, score, settle
        self.last: list[BatchValues] = held

    def width(self, decided: int, kept: int) -> int:
        return 1

    def scores(self, modes: dict[str, Mode], trials: list[dict[str, Mode]]) -> list[T]:
        share = 1.0 / len(self.held)
        self.last = []
        for before in self.held:
            self.last.append(self.sim.changed(trials[0], before, share))
            done = len(self.last) == len(self.held)
            if not done and self.settle is not None:
                found = self.settle([values.output for values in self.last])
                if found is not None:  # decided: the move is not kept, so its values are not
                    return [found]
        return [self.score([values.output for values in self.last])]

    def keep(self) -> None:  # the move just scored is kept: its values are the config's now
        self.held = self.last


WINDOW_MOST = 16  # the most moves a window scores from one config


class _WindowTrier(Generic[T]):
    """The config run again for each window of moves, batch by batch (:func:`sweep`)."""

    def __init__(
        self, sim: Simulation, batches: Sequence[object], score: Callable[[list[Any]], T], settle: Settle[T] | None
    ) -> None:
        self.sim, self.batches, self.score, self.settle = sim, batches, score, settle

    def width(self, decided: int, kept: int) -> int:
        # about as many moves as are decided between two kept ones (a window costs one forward more)
        return max(1, min(WINDOW_MOST, round((decided + 8) / (kept + 1))))

    def scores(self, modes: dict[str, Mode], trials: list[dict[str, Mode]]) -> list[T]:
        return sweep(self.sim, modes, trials, self.batches, self.score, settle=self.settle)[1]

    def keep(self) -> None:  # the next window runs the new config again: nothing held
        return None


def _nbytes(value: Any) -> int:
    """The bytes of the tensors in ``value`` (a node's value, an output; a batch's values: the graph's
    constants left out, the model's own and shared)."""
    if isinstance(value, dict):
        return sum(_nbytes(found) for node, found in value.items() if getattr(node, "op", "") != "get_attr")
    return sum(leaf.nbytes for leaf in _pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor))


def _fitting(output: Any, batches: int, budget: int) -> int:
    """How many configs' outputs on ``batches`` batches like ``output`` fit ``budget`` bytes (one at least)."""
    return max(1, budget // max(_nbytes(output) * batches, 1))


__all__ = ["MEMORY_BUDGET", "Move", "Tried", "greedy", "sweep"]
