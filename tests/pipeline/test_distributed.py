"""Calibration and comparison over gloo processes, torchrun, offline merges: one result, as from one process.

Every statistic that is exact (counts, minima, maxima, per-batch percentiles,
the sampled columns) must be equal; sums equal up to float rounding (they are
added in another order).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import qinsight
from qinsight.core.comparison import ActivationComparison
from qinsight.core.report import Report

from _same import assert_same, assert_same_comparison, assert_same_report

sys.path.insert(0, str(Path(__file__).parent.parent))
import _distributed  # noqa: E402

pytestmark = pytest.mark.slow  # real weights, or processes of their own: the whole suite's tier


@pytest.fixture(scope="module")
def one_process() -> dict[str, Any]:
    return _distributed.single_process()


def spawn(world_size: int, folder: Path, fail: bool = False) -> list[dict[str, Any]]:
    mp.spawn(_distributed.rank_main, args=(world_size, str(folder), fail), nprocs=world_size, join=True)
    return [pickle.loads((folder / f"rank{rank}.pkl").read_bytes()) for rank in range(world_size)]


# three ranks: the extended tier (two show the exchange; three only more of it)
@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.extended(1))])
def test_ranks_give_the_one_process_report_and_comparison(
    world_size: int, one_process: dict[str, Any], tmp_path: Path
) -> None:
    ranks = spawn(world_size, tmp_path, fail=world_size == 2)
    single: Report = one_process["report"]
    assert single.metadata.batches == _distributed.BATCHES
    sampled = [
        o for o in single.observations if o.stats.spec.percentile_samples and o.stats.channel_min and o.fqn == "0"
    ]
    assert sampled, "the test must cover sampled percentiles"
    for rank, results in enumerate(ranks):
        assert_same_report(results["report"], single, tmp_path)  # every rank holds the whole report
        assert_same_comparison(results["compare"], one_process["compare"])
        configs, expected = results["configs"], one_process["configs"]
        assert [(row.fqn, row.best) for row in configs.rows] == [(row.fqn, row.best) for row in expected.rows]
        for row, want in zip(configs.rows, expected.rows):
            for score, wanted in zip(row.scores, want.scores):
                assert math.isclose(score.metric("sqnr"), wanted.metric("sqnr"), rel_tol=1e-6), (row.fqn, score.config)
        if world_size == 2:
            expected = (
                "CalibrationError: the calibration data raised at batch 3"
                if rank == 1
                else "ShardError: rank 1: CalibrationError"
            )
            assert results["failure"].startswith(expected), results["failure"]


def test_merged_shard_reports_equal_the_one_process_report(one_process: dict[str, Any], tmp_path: Path) -> None:
    batches = _distributed.data()
    shards = [
        qinsight.diagnose(
            _distributed.model(), batches[rank::2], shard=qinsight.types.Shard(rank=rank, world_size=2), verify=False
        )
        for rank in range(2)
    ]
    assert [s.metadata.batches for s in shards] == [4, 3]
    assert_same_report(qinsight.merge_reports(shards), one_process["default_report"], tmp_path)
    # the weights' statistics travel in the files: a reloaded pair merges the same without the model
    paths = [tmp_path / f"shard{rank}.json" for rank in range(2)]
    for shard, path in zip(shards, paths):
        qinsight.save_report(shard, path)
    merged = qinsight.merge_reports([qinsight.load_report(p) for p in paths])
    assert_same_report(merged, one_process["default_report"], tmp_path)


def test_merge_refuses_reports_that_are_not_one_model_diagnosed_one_way() -> None:
    batches = _distributed.data()[:2]
    base = qinsight.diagnose(_distributed.model(), batches)
    other_weights = _distributed.model()
    with torch.no_grad():
        other_weights[0].weight.mul_(2)
    cases = {
        "weight of 0 differs": qinsight.diagnose(other_weights, batches),
        "detectors or their parameters": qinsight.diagnose(
            _distributed.model(),
            batches,
            detectors=["qinsight.per_channel", qinsight.detectors.OutlierDetector(ratio_threshold=9.0)],
        ),
        "backend": qinsight.diagnose(_distributed.model(), batches, deploy="onednn"),
    }
    for message, other in cases.items():
        with pytest.raises(qinsight.errors.MergeError, match=message):
            qinsight.merge_reports([base, other])
    comparison = qinsight.Comparison(activations=ActivationComparison(layers=()))
    with pytest.raises(qinsight.errors.MergeError, match="holds a comparison"):
        qinsight.merge_reports([base, base.with_comparison(comparison)])
    with pytest.raises(qinsight.errors.MergeError, match="no reports"):
        qinsight.merge_reports([])


def test_distributed_needs_a_process_group_and_shard_excludes_it() -> None:
    with pytest.raises(qinsight.errors.InvalidParameterError, match="initialized process group"):
        qinsight.diagnose(_distributed.model(), _distributed.data()[:1], shard="distributed")
    with pytest.raises(qinsight.errors.InvalidParameterError, match="initialized process group"):
        list(qinsight.shard([1, 2]))


def _cli(*args: str, cwd: Path, torchrun: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    prefix = (
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={torchrun}"]
        if torchrun
        else [sys.executable]
    )
    return subprocess.run(
        [*prefix, "-m", "qinsight", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.extended(1)  # torchrun's ranks run in CI through test_torchrun_error_on_one_rank_is_one_line
def test_torchrun_diagnose_and_merge_on_the_command_line(tmp_path: Path) -> None:
    # unverified: ranks and merges verify nothing, so the one-process run they must equal does not either
    source = ["--model", "_distributed:model", "--data", "_distributed:data", "--quiet", "--no-verify"]
    one = _cli("diagnose", *source, "--out", "one.json", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    two = _cli("diagnose", *source, "--out", "two.json", cwd=tmp_path, torchrun=2)
    assert two.returncode == 0, two.stderr
    assert two.stdout == one.stdout  # printed once, by rank 0, the same text
    assert [line for line in two.stderr.splitlines() if line.startswith("qinsight:")] == ["qinsight: wrote two.json"]
    assert_same(json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "two.json").read_text()))
    compared = [_cli("compare", *source[:4], "--out", f"cmp{n}.json", cwd=tmp_path, torchrun=n) for n in (None, 2)]
    assert all(run.returncode == 0 for run in compared), compared[1].stderr
    single, ranked = (qinsight.load_report(tmp_path / f"cmp{n}.json").comparison for n in (None, 2))
    assert single is not None and ranked is not None and single.activations and ranked.activations
    assert_same_comparison(ranked.activations, single.activations)
    for part in range(2):  # a batch job on two machines, without a process group
        run = _cli("diagnose", *source, "--shard", f"{part}/2", "--out", f"part{part}.json", cwd=tmp_path)
        assert run.returncode == 0, run.stderr
    merged = _cli("merge", "part0.json", "part1.json", "--out", "merged.json", cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout == one.stdout
    assert_same(json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "merged.json").read_text()))
    bad_shard = _cli("diagnose", *source, "--shard", "2/2", cwd=tmp_path)
    assert bad_shard.returncode == 2 and "--shard must look like I/N" in bad_shard.stderr
    (tmp_path / "other.json").write_text(
        (tmp_path / "one.json").read_text().replace('"backend": "x86"', '"backend": "fbgemm"')
    )
    refused = _cli("merge", "one.json", "other.json", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "qinsight: error: report 2 differs from report 1 in its backend: not one model diagnosed one way"
    ]


def test_torchrun_error_on_one_rank_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(
        "import _distributed\n"
        "def data(rank, world_size):\n"
        "    for local, batch in enumerate(_distributed.data()[rank::world_size]):\n"
        "        if rank == 1 and local == 1:\n"
        "            raise OSError('shard file 3 is unreadable')\n"
        "        yield batch\n"
    )
    run = _cli(
        "diagnose",
        "--model",
        "_distributed:model",
        "--data",
        "broken:data",
        "--out",
        "x.json",
        cwd=tmp_path,
        torchrun=2,
    )
    assert run.returncode != 0 and not (tmp_path / "x.json").exists()
    ours = [line for line in run.stderr.splitlines() if line.startswith("qinsight:")]
    assert ours == [
        "qinsight: error: rank 1: CalibrationError: the calibration data raised at batch 3: OSError: shard file 3 is "
        "unreadable"
    ]
