"""One plan being made: the object that owns what its stages share.

:func:`qinsight.plan` builds a :class:`PlanRun` once, and every stage (:mod:`.stages`, :mod:`.verify`)
reads and records through it: the request as the search holds it, the float model's scorer, the
progress line, the configs the flow failed to build or run, and (from :meth:`PlanRun.calibrated` on)
the simulation's :class:`~qinsight.planning.search.Search`. What a stage returns is a frozen record of
plain values; nothing mutable travels in one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import attrs
from torch import nn

from qinsight.apply.trial import Trial, model_outputs, weight_counts
from qinsight.compare.programs import LoweredModule
from qinsight.core.comparison import ProgramCost
from qinsight.core.errors import QinsightError
from qinsight.core.metrics import MetricSpec
from qinsight.core.notes import Note, NoteKind
from qinsight.core.outcomes import FailedConfig, Outcome
from qinsight.core.plan import PlanCost, PlanPrograms, StageTime
from qinsight.core.progress import Progress
from qinsight.core.suggestions import QuantSuggestion
from qinsight.planning.checks import RealScore
from qinsight.planning.request import PlanRequest
from qinsight.planning.scores import Scorer
from qinsight.planning.search import Search
from qinsight.planning.simulated_flows import Flow
from qinsight.planning.switches import Mode

T = TypeVar("T")


@attrs.frozen(eq=False)
class Measured:
    """A config quantized for real: its ``outcome`` on the evaluation data, its ``program``'s time and
    size where lowered, the layers the converted model ``quantized``, and its outputs on this process's
    held-out batches where run (``None``: not run on them)."""

    outcome: Outcome
    program: ProgramCost | None = None
    quantized: frozenset[str] = frozenset()
    held_out: tuple[Any, ...] | None = None
    failure: Exception | None = None  # the flow's own error, where it failed in this process

    @property
    def failed(self) -> bool:
        return isinstance(self.outcome, FailedConfig)


class PlanRun:
    """A plan's shared state: the request as ``asked`` and as the search holds it (:attr:`request`: with
    a confidence, the agreement whose bound meets the target over these evaluation rows), the float
    ``model``'s :attr:`scorer` on the evaluation data, ``progress``, the failures and the search."""

    def __init__(self, asked: PlanRequest, model: nn.Module, progress: Progress) -> None:
        self.asked, self.model, self.progress = asked, model, progress
        self.ranks = ranks = asked.ranks
        # what this process runs of the evaluation and held-out data: all of it, or its rank's share
        self.evaluation = ranks.share(asked.evaluation, "evaluation_data")
        self.held_out = ranks.share(asked.held_out, "held_out_data") if asked.held_out else ()
        reference = ranks.gathered(model_outputs(model, self.evaluation))
        self.scorer = Scorer(reference, asked.metric, asked.metric_name, asked.evaluation, ranks.gather)
        self.request = attrs.evolve(asked, goal=asked.held_goal(len(self.scorer.rows)))
        self.spec: MetricSpec = asked.spec  # the direction every comparison of scores takes
        self._failures: dict[str, int] = {}  # each distinct error of the flow, and how many configs it ended
        self._search: Search | None = None
        self._stages: list[StageTime] = []
        self._real_configs, self._real_seconds = 0, 0.0  # configs quantized for real so far, and their seconds
        # each distinct config measured for real: quantized (and lowered) once
        self._measured: dict[tuple[Flow, tuple[QuantSuggestion, ...]], Measured] = {}
        self._float_program: ProgramCost | None = None

    def timed(self, stage: str, step: Callable[..., T], *args: Any) -> T:
        """``step(*args)``, its wall time and the configs it quantized for real recorded as ``stage``."""
        began, configs, seconds = time.perf_counter(), self._real_configs, self._real_seconds
        try:
            return step(*args)
        finally:
            took = time.perf_counter() - began
            real, real_seconds = self._real_configs - configs, self._real_seconds - seconds
            self._stages.append(StageTime(stage=stage, seconds=took, real_configs=real, real_seconds=real_seconds))

    def cost(self, before: tuple[StageTime, ...] = ()) -> PlanCost:
        """Where the plan's time went: ``before`` (the diagnosis, where the plan made it), then each
        stage :meth:`timed`, and the simulation's forwards."""
        forwards = self._search.sim.evaluations if self._search is not None else 0.0
        return PlanCost(stages=(*before, *self._stages), simulated_forwards=forwards)

    def trial(self, flow: Flow, advice: tuple[QuantSuggestion, ...], scored: Sequence[object]) -> Trial:
        """``advice``'s config quantized for real through ``flow`` on the calibration data and run on
        ``scored`` (:meth:`Flow.trial`), counted and timed for :meth:`cost`."""
        began = time.perf_counter()
        found = flow.trial(advice, self.request.calibration, scored)
        self._real_configs += 1
        self._real_seconds += time.perf_counter() - began
        return found

    def real(self, flow: Flow, advice: tuple[QuantSuggestion, ...], held_out: bool = False) -> Outcome:
        """``advice``'s config quantized for real through ``flow`` (prepare, calibrate, convert, run) and
        scored, once per distinct config (a config asked again is the same measurement, and lowering
        one costs tens of seconds); where the flow cannot build or run it, a :class:`FailedConfig`,
        recorded for the notes (a metric's own error is not caught: it is the user's). ``held_out``: run
        on the held-out batches too, kept for :meth:`measured` (the verification's configs: the one it
        ends with is then not quantized again)."""
        return self.measured(flow, advice, held_out).outcome

    def measured(self, flow: Flow, advice: tuple[QuantSuggestion, ...], held_out: bool = False) -> Measured:
        """:meth:`real`'s whole measurement of ``advice``'s config (``held_out``: its held-out outputs too)."""
        key = (flow, advice)
        found = self._measured.get(key)
        if found is not None and (found.held_out is not None or not held_out or found.failed):
            return found
        held = self.held_out if held_out else ()
        trial = self.trial(flow, advice, [*self.evaluation, *held])
        error = next((error for error in self.ranks.each(trial.error) if error), "")  # one rank's: every rank's
        if error:
            self._failures[error] = self._failures.get(error, 0) + 1
            self._measured[key] = Measured(FailedConfig(error), failure=trial.failure)
        else:
            outputs, count = list(trial.outputs), len(self.evaluation)
            score, program = self.scorer(outputs[:count]), self.ranks.first(trial.program)
            kept = tuple(outputs[count:]) if held_out else None
            self._measured[key] = Measured(score, program, trial.quantized, kept)
        return self._measured[key]

    def float_program(self) -> None:
        """The float model lowered as the configs are (``lowered=True``) and run on the evaluation data:
        the time and size every config's program is judged by."""
        if self.request.lowering is None:
            return
        floated = LoweredModule(self.request.lowering, self.model, "the float model")
        model_outputs(floated, self.evaluation)
        self._float_program = self.ranks.first(floated.cost())

    def programs(self, flow: Flow, advice: tuple[QuantSuggestion, ...], default: Flow) -> PlanPrograms | None:
        """``advice``'s program through ``flow``, the ``default`` flow's config's and the float model's,
        as timed (``None``: the plan does not lower its configs, or the flow could not run one)."""
        planned, started = self.measured(flow, advice).program, self.measured(default, ()).program
        if planned is None or started is None or self._float_program is None:
            return None
        return PlanPrograms(planned=planned, default=started, float_model=self._float_program)

    def real_score(self, flow: Flow, held_out: bool = False) -> RealScore:
        """:meth:`real` through ``flow``, as a function of the config."""
        return functools.partial(self.real, flow, held_out=held_out)

    def failure_notes(self, flow: str) -> tuple[Note, ...]:
        """Each distinct error of the flow once, with how many candidate configs it left out."""
        return tuple(
            Note(
                NoteKind.FAILED_CONFIGS,
                f"{count} candidate config{'s' if count > 1 else ''} the {flow} flow could not build or run, "
                f"left out: {error}",
            )
            for error, count in self._failures.items()
        )

    def calibrated(self, flow: Flow, model: nn.Module, kinds: Mapping[str, str], floats: Collection[str]) -> Search:
        """The simulation of ``flow`` (quantizing ``model``) calibrated on the request's calibration data,
        and the search over its sites that ``kinds`` names (site: its kind), now the run's; ``floats``
        stay float, unsearched."""
        self.progress("calibrating the simulation", 0, 1)
        sim = flow.simulation(list(self.request.calibration))
        sim.memory_budget = self.request.memory_budget
        fixed = {site: Mode.FLOAT for site in floats if site in sim.sites}
        candidates = [site for site in sim.sites if site in kinds and site not in fixed]
        parameters = weight_counts(model, candidates)
        sim.agree = self.ranks.all_agree
        evaluation = list(self.evaluation)
        self._search = Search(
            sim, self.scorer, evaluation, candidates, parameters, dict(kinds), self.progress, fixed, self.spec
        )
        return self._search

    @property
    def search(self) -> Search:
        """The search :meth:`calibrated` set up; a stage asking before it is qinsight's own mistake."""
        if self._search is None:
            raise QinsightError("qinsight's plan asked for its search before calibrating the simulation")
        return self._search


__all__ = ["PlanRun"]
