"""The calibration hot path, counted on the Llama-shaped stack: aten ops per observed tensor and
host reads per batch, so that a regression fails on any machine, a GPU's absence included."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from _checks import HostReads

import qinsight
from qinsight.examples.stack import llama_stack, stack_batches
from qinsight.observe import observers

# The aten ops behind a host read (and behind a reading from C++), as the profiler names them.
SYNC_OPS = {"aten::item", "aten::_local_scalar_dense"}

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def _top_level_ops(profile: torch.profiler.profile) -> list[str]:
    """The aten ops called from Python (not from inside another aten op): each one dispatch, a launch on a GPU."""
    return [
        event.name
        for event in profile.events()
        if event.name.startswith("aten::")
        and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::"))
    ]


@contextmanager
def _calibrating(device: str) -> Iterator[tuple[qinsight.pipeline.Session, torch.nn.Module, list[torch.Tensor]]]:
    """The width-512 stack instrumented with the default detectors, its first batch already seen."""
    model = llama_stack().to(device)
    batches = [b.to(device) for b in stack_batches(count=3)]
    with qinsight.instrument(model, example_inputs=batches[0]) as session, torch.no_grad():
        model(batches[0])  # the first batch may read the host: the observers' constants are made there
        yield session, model, batches[1:]


@pytest.mark.parametrize("device", DEVICES)
def test_calibration_reads_nothing_on_the_host_after_the_first_batch(device: str) -> None:
    with _calibrating(device) as (_, model, batches):
        with HostReads() as reads, torch.profiler.profile() as profile:
            for batch in batches:
                model(batch)
    assert reads.seen == []
    assert not SYNC_OPS & {event.name for event in profile.events()}
    if device == "cuda":  # the device's own word: any synchronising call raises, after the first batch
        with _calibrating(device) as (_, model, batches):
            torch.cuda.set_sync_debug_mode("error")
            try:
                model(batches[0])
            finally:
                torch.cuda.set_sync_debug_mode("default")


def test_an_observed_tensor_costs_at_most_15_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted over two steady batches. Measurements wait to be summarized a few at a time (a summary
    costs about 28 ops whatever their number): at this width the small ones wait until freeze."""
    measured = []
    measure = observers.measure

    def counting(x: Any, *args: Any) -> torch.Tensor | None:
        measured.append(x)
        return measure(x, *args)

    with _calibrating("cpu") as (_, model, batches):
        plain = llama_stack().eval()
        with torch.profiler.profile() as plain_profile:
            for batch in batches:
                plain(batch)
        monkeypatch.setattr(observers, "measure", counting)
        with torch.profiler.profile() as profile:
            for batch in batches:
                model(batch)
    extra = len(_top_level_ops(profile)) - len(_top_level_ops(plain_profile))
    nested = sum(e.name.startswith("aten::") for e in profile.events()) - sum(
        e.name.startswith("aten::") for e in plain_profile.events()
    )
    tensors = len({id(x) for x in measured}) / len(
        batches
    )  # an id reused by a freed tensor counts once: fewer, never more
    print(
        f"{extra / len(batches):.0f} ops per batch ({nested / len(batches):.0f} with the ops they call) for "
        f"{tensors:.0f} tensors"
    )
    assert tensors >= 28  # every Linear input at least, and the ops around them
    assert extra / len(batches) / tensors <= 15
