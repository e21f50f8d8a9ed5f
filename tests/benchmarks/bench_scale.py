"""Scale: ranks against one process, the memory observers add, and a real LLM end to end.

Not a test: run it by hand (each part alone with its name),
    python tests/benchmarks/bench_scale.py [ranks] [memory] [smollm]

- ranks: throughput of 2 gloo ranks against 1 (each rank one thread) for a
  whole distributed diagnose, from a barrier after the model is built to the
  report on every rank, on the ResNet-like and the encoder benchmark models.
- memory: the transient memory observers add to one batch, as peak RSS
  growth during the batch, instrumented minus plain forward, in fresh
  processes; against the batch's largest activation. Run with glibc's
  ``MALLOC_MMAP_THRESHOLD_=65536`` (large blocks are returned when freed, so
  RSS follows what is alive) and with glibc's defaults.
- smollm: SmolLM2-135M (real weights) diagnosed with the four default
  detectors against its plain float forward over the same batches (short and
  long rows), one thread, round-robin, median of 3.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

warnings.filterwarnings("ignore")
BATCHES = 8


def _models() -> dict[str, tuple[Callable[[], nn.Module], Callable[[int], torch.Tensor]]]:
    from qinsight.examples import EncoderLayer, ResNet18

    def encoder() -> nn.Module:
        return nn.Sequential(*(EncoderLayer(384, 12, 1536) for _ in range(6))).eval()

    return {
        "resnet-like (8x3x224x224)": (
            lambda: ResNet18().eval(),
            lambda i: torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(i)),
        ),
        "encoder (8x128x384, 6 layers)": (
            encoder,
            lambda i: torch.randn(8, 128, 384, generator=torch.Generator().manual_seed(i)),
        ),
    }


def _rank(rank: int, world_size: int, folder: str, name: str) -> None:
    import torch.distributed as dist

    import qinsight

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size)
    build, batch = _models()[name]
    torch.manual_seed(0)
    model = build()
    batches = [batch(i) for i in range(rank, BATCHES, world_size)]
    dist.barrier()
    start = time.perf_counter()
    qinsight.diagnose(model, batches, shard="distributed")
    elapsed = time.perf_counter() - start
    if rank == 0:
        with open(os.path.join(folder, "seconds"), "w") as out:
            out.write(str(elapsed))
    dist.barrier()  # no rank tears the group down while another still reads from it (gloo aborts)
    dist.destroy_process_group()


def ranks() -> None:
    import torch.multiprocessing as mp

    print(f"ranks: a distributed diagnose of {BATCHES} batches, each rank one thread (median of 3)")
    for name in _models():
        seconds: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(3):
            for world_size in (1, 2):
                with tempfile.TemporaryDirectory() as folder:
                    mp.spawn(_rank, args=(world_size, folder, name), nprocs=world_size, join=True)
                    seconds[world_size].append(float(open(os.path.join(folder, "seconds")).read()))
        one, two = (statistics.median(seconds[n]) for n in (1, 2))
        print(f"  {name:<32} 1 rank {one:6.2f} s   2 ranks {two:6.2f} s   throughput x{one / two:.2f}")


def _peak_growth(variant: str) -> dict[str, float]:
    """In a fresh process: MiB of peak RSS growth over one batch, and the largest activation's MiB."""
    import qinsight

    torch.set_num_threads(1)
    if variant.startswith("smollm"):
        from qinsight.examples.smollm import load_smollm2, token_windows

        model: nn.Module = load_smollm2()
        batch = token_windows(1, rows=4, tokens=512)[0]
        largest = 4 * 512 * 49152 * 4  # the logits
    else:
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(4096, 4096) for _ in range(3))).eval()
        batch = torch.randn(1, 2048, 4096)
        largest = batch.numel() * 4
    if variant.endswith("observed"):
        context = qinsight.instrument(model)
        context.__enter__()
    with torch.no_grad():
        model(batch)  # warm: first-call allocations are not the observers'
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets the peak RSS (VmHWM)
        before = _status("VmRSS")
        model(batch)
    return {"growth": _status("VmHWM") - before, "largest": largest / 2**20}


def _status(field: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024


def memory() -> None:
    print("memory: peak RSS growth over one batch (MiB), observed minus plain, against the largest activation")
    for model in ("stack", "smollm"):
        label = "4096-wide Linear x3, 1x2048 tokens" if model == "stack" else "SmolLM2-135M, 4x512 tokens"
        for env_name, env in (("mmap threshold 64 KiB", {"MALLOC_MMAP_THRESHOLD_": "65536"}), ("glibc defaults", {})):
            runs = {}
            for variant in ("plain", "observed"):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", f"{model}-{variant}"],
                    env={**os.environ, **env},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[variant] = json.loads(out.stdout.strip().splitlines()[-1])
            added = runs["observed"]["growth"] - runs["plain"]["growth"]
            largest = runs["plain"]["largest"]
            print(
                f"  {label:<36} {env_name:<22} plain {runs['plain']['growth']:7.1f}  observed "
                f"{runs['observed']['growth']:7.1f}  added {added:6.1f} = {added / largest:6.1%} of {largest:.0f}"
            )


def smollm() -> None:
    import qinsight
    from qinsight.examples.smollm import load_smollm2, token_windows

    torch.set_num_threads(1)
    model = load_smollm2()
    for rows, tokens in ((4, 128), (2, 1024)):
        batches = token_windows(BATCHES, rows=rows, tokens=tokens)

        def plain() -> None:
            with torch.no_grad():
                for batch in batches:
                    model(batch)

        def diagnose() -> None:
            qinsight.diagnose(model, batches)

        plain()
        times: dict[str, list[float]] = {"plain": [], "diagnose": []}
        for _ in range(3):
            for name, run in (("plain", plain), ("diagnose", diagnose)):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        p, d = statistics.median(times["plain"]), statistics.median(times["diagnose"])
        print(
            f"smollm: {BATCHES} batches of {rows}x{tokens} tokens, one thread: float {p:.2f} s, diagnose {d:.2f} s "
            f"(x{d / p:.2f}; trace, calibration, detectors and report included)"
        )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_peak_growth(sys.argv[2])))
        return
    parts = {"ranks": ranks, "memory": memory, "smollm": smollm}
    for part in sys.argv[1:] or parts:
        parts[part]()


if __name__ == "__main__":
    main()
