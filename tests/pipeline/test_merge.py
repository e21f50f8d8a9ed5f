"""The merge of a run's parts is that run: every field of the report, not a chosen few."""

from __future__ import annotations

from pathlib import Path

import attrs
import torch
from _models import MLP, seeded

import qinsight
from qinsight.core.fx_activations import FxActivations
from qinsight.core.report import Report

from _same import assert_same, report_json


def test_the_merge_of_a_runs_shards_equals_the_run_field_for_field(tmp_path: Path) -> None:
    """An MLP whose shards see too little data to suggest what the whole run does (each checked FX
    kernels under its own config when the check ran at diagnosis): merged, every field equals one
    unverified run on all the batches, the sums to float rounding; verifying the merge checks it."""
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(8, 16, generator=generator) for _ in range(4)]
    one = qinsight.diagnose(seeded(MLP()), batches, verify=False)
    shards = [
        qinsight.diagnose(
            seeded(MLP()), batches[rank::2], shard=qinsight.types.Shard(rank=rank, world_size=2), verify=False
        )
        for rank in range(2)
    ]
    merged = qinsight.merge_reports(shards)
    assert_same(report_json(merged, tmp_path, "merged"), report_json(one, tmp_path, "one"))
    for field in attrs.fields(Report):  # and as values, where no float sum is in them
        if field.name not in ("observations", "results"):
            assert getattr(merged, field.name) == getattr(one, field.name), field.name
    assert merged.fx_activations == one.fx_activations == FxActivations(checked=False)
    verified = qinsight.verify_report(seeded(MLP()), merged, batches)
    assert verified.fx_activations is not None and verified.fx_activations.checked and verified.verification[0].verified
