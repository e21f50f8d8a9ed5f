"""plan(..., shard="distributed"): each rank runs a share of the evaluation batches, and every rank
returns the plan one process gives."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch.multiprocessing as mp

import qinsight

sys.path.insert(0, str(Path(__file__).parent.parent))
import _distributed  # noqa: E402


def _decided(plan: qinsight.QuantPlan) -> str:
    """Every field of ``plan`` but what it cost to make (seconds, forwards: a rank runs a share), as
    text: NaN compares equal to itself there."""
    return repr(attrs.evolve(plan, cost=None, evaluations=0))


@pytest.mark.slow  # processes of their own: the whole suite's tier
def test_two_gloo_ranks_give_the_plan_one_process_gives(tmp_path: Path) -> None:
    one = _distributed.planned()
    assert one.kept_float and one.reached, "the test must cover a search that keeps sites in float"
    mp.spawn(_distributed.plan_rank_main, args=(2, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        plan = pickle.loads((tmp_path / f"plan{rank}.pkl").read_bytes())
        assert _decided(plan) == _decided(one), rank


@pytest.mark.slow  # processes of their own: the whole suite's tier
def test_qinsight_plan_under_torchrun_writes_the_plan_one_process_writes(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["-m", "qinsight", "plan", "--example", "cnn", "--batches", "4", "--eval-batches", "5", "--quiet"]
    runs = {}
    for name, prefix in (("one", []), ("two", ["-m", "torch.distributed.run", "--nproc-per-node=2"])):
        command = [sys.executable, *prefix, *args, "--target", "sqnr>=50", "--out", f"{name}.json"]
        runs[name] = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert runs[name].returncode == 0, runs[name].stderr
    assert [line for line in runs["two"].stderr.splitlines() if line.startswith("qinsight:")] == [
        "qinsight: wrote two.json"  # rank 0 alone speaks and writes
    ]
    one, two = (qinsight.load_report(tmp_path / f"{name}.json").plan for name in ("one", "two"))
    assert one is not None and two is not None and one.kept_float
    assert _decided(two) == _decided(one)


def test_a_distributed_plan_outside_a_process_group_is_one_error() -> None:
    from qinsight.examples.builtin import example

    chosen = example("cnn")
    batches = chosen.data(4)
    distributed = qinsight.types.Resources(shard="distributed")
    with pytest.raises(qinsight.errors.InvalidParameterError, match="an initialized process group"):
        qinsight.plan(chosen.model(), batches[:2], batches[2:], resources=distributed)
    with pytest.raises(qinsight.errors.InvalidParameterError, match=r'Resources: shard=.*"distributed"'):
        qinsight.types.Resources(shard="rank0")  # type: ignore[arg-type]


def test_each_rank_needs_a_batch_of_its_own() -> None:
    from qinsight.core.shards import Shard
    from qinsight.planning.plan_ranks import Ranks

    ranks = Ranks(Shard(rank=1, world_size=3))
    assert ranks.share(list("abcdefg"), "evaluation_data") == ("b", "e")
    with pytest.raises(qinsight.errors.InvalidParameterError, match=r"at least one batch per rank \(3\)"):
        ranks.share(["a", "b"], "held_out_data")
