"""What the distributed tests run in each rank (spawned processes import it by name)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

BATCHES = 7  # not a multiple of 2 or 3: ranks get unequal shares
# Without the equalization detector, whose per-channel inputs are exact, the outlier
# detector's percentiles are sampled (its default cap).
SAMPLED = ("qinsight.per_channel", "qinsight.dynamic_static", "qinsight.outliers")


def model() -> nn.Module:
    """Conv inputs of 10 x 48 x 48 = 23,040 values per channel: over the 16,384 samples cap, so the
    percentiles are sampled and their seeds must follow the global batch index."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2), nn.Flatten(), nn.Linear(8 * 44 * 44, 10)
    ).eval()


def data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(10, 3, 48, 48, generator=g) * (1 + i % 3) for i in range(BATCHES)]


def configs() -> dict[str, object]:
    """Two candidate configs for compare_configs."""
    return {"x86": get_default_qconfig_mapping("x86"), "fbgemm": get_default_qconfig_mapping("fbgemm")}


def quantized(float_model: nn.Module, batches: list[torch.Tensor]) -> nn.Module:
    prepared = prepare_fx(float_model, get_default_qconfig_mapping("x86"), (batches[0],))
    with torch.no_grad():
        for batch in batches:
            prepared(batch)
    return convert_fx(prepared)  # type: ignore[no-any-return]


def single_process() -> dict[str, Any]:
    import qinsight

    batches = data()
    float_model = model()
    return {
        # unverified, as the ranks' and the merges' reports are (they run no verification)
        "report": qinsight.diagnose(float_model, batches, detectors=SAMPLED, verify=False),
        "default_report": qinsight.diagnose(float_model, batches, verify=False),
        "compare": qinsight.compare_activations(float_model, quantized(model(), batches), batches),
        "configs": qinsight.compare_configs(float_model, configs(), batches),
    }


def rank_main(rank: int, world_size: int, folder: str, fail: bool) -> None:
    """One rank: diagnose and compare on its shard, results pickled to ``folder``."""
    import torch.distributed as dist

    import qinsight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size)
    try:
        batches = data()
        results: dict[str, Any] = {
            "report": qinsight.diagnose(model(), qinsight.shard(batches), detectors=SAMPLED, shard="distributed"),
            "compare": qinsight.compare_activations(
                model(), quantized(model(), batches), qinsight.shard(batches), distributed=True
            ),
            # calibrated on all batches on every rank, measured on each rank's stride of them
            "configs": qinsight.compare_configs(model(), configs(), batches, distributed=True),
        }
        if fail:
            results["failure"] = _failure(rank)
        Path(folder, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))
        dist.barrier()  # no rank tears the group down while another still reads from it (gloo aborts)
    finally:
        dist.destroy_process_group()


def _failure(rank: int) -> str:
    """What each rank sees when rank 1's data raises at its second batch (global batch 3)."""
    import qinsight

    def batches() -> Any:
        for local, batch in enumerate(qinsight.shard(data())):
            if rank == 1 and local == 1:
                raise OSError("shard file 3 is unreadable")
            yield batch

    try:
        qinsight.diagnose(model(), batches(), shard="distributed")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def planned(shard: Any = None) -> Any:
    """A plan of the built-in CNN that keeps sites in float, its 5 evaluation and 3 held-out batches
    shared unequally over 2 ranks."""
    import qinsight
    from qinsight.examples.builtin import example

    chosen = example("cnn")
    batches = chosen.data(12)
    calibration, evaluation, held_out = batches[:4], batches[4:9], batches[9:]
    resources = qinsight.types.Resources(shard=shard)
    return qinsight.plan(
        chosen.model(), calibration, evaluation, goal="sqnr>=50", held_out_data=held_out, resources=resources
    )


def plan_rank_main(rank: int, world_size: int, folder: str) -> None:
    """One rank of a distributed plan: the plan pickled to ``folder``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/plan", rank=rank, world_size=world_size)
    try:
        Path(folder, f"plan{rank}.pkl").write_bytes(pickle.dumps(planned("distributed")))
        dist.barrier()
    finally:
        dist.destroy_process_group()
