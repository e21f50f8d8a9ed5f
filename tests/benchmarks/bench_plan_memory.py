"""A plan's peak memory and time against the evaluation data it scores on: MobileNetV2, real weights
(or torchvision's ResNet-50 with random weights, ``--model resnet50``: the cost is the architecture's).

Each plan runs in its own process (peak RSS is per process), on 4 calibration crops and N evaluation
crops, to ``top1>=0.9`` (``--target``); printed per N: the peak RSS over what the process held before
planning and the process's own, the seconds, the evaluations (whole forwards of the simulation), and
the ratio of memory and time to the smallest N. A plan whose memory grows with N shows it here.
``--ranks 2`` plans each N under ``torchrun`` too (2 gloo ranks, one thread each,
``Resources(shard="distributed")``): each rank's peak and whether every rank's plan is the one
process's (on one thread then: torch's kernels round otherwise on two, and a crop's top-1 can flip).

    python tests/benchmarks/bench_plan_memory.py
    python tests/benchmarks/bench_plan_memory.py --deploy xnnpack --crops 8,24,48
    python tests/benchmarks/bench_plan_memory.py --crops 16 --ranks 2
    python tests/benchmarks/bench_plan_memory.py --model resnet50 --crops 64 --target "sqnr>=30"   # .zoo
    PYTHONPATH=/path/to/another/checkout python tests/benchmarks/bench_plan_memory.py   # the same, there

Run it on an idle machine: each plan takes minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys


def _model(name: str) -> object:
    """ImageNet MobileNetV2 (real weights), or torchvision's ResNet-50 with random weights (seeded: what a
    plan costs depends on the architecture and the data, not on the weights; torchvision from ``.zoo``)."""
    import torch

    if name == "mobilenet_v2":
        from _real import mobilenet_v2_or_skip

        return mobilenet_v2_or_skip().eval()
    from _zoo import INSTALL, torchvision_models

    models = torchvision_models()
    if models is None:
        raise SystemExit(f"torchvision's ResNet-50 needs it in .zoo: {INSTALL}")
    torch.manual_seed(0)
    return models.resnet50().eval()


def measure(
    crops: int, deploy: str, distributed: bool, threads: int, model_name: str, target: str
) -> dict[str, object]:
    """In the child process (a rank, ``distributed``): one plan on ``crops`` evaluation crops with
    ``threads`` torch threads, its peak RSS growth in MB."""
    import resource
    import time
    import warnings

    import attrs
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from _data import photo_crops

    import qinsight

    if distributed:
        torch.distributed.init_process_group("gloo")
    torch.set_num_threads(threads)
    warnings.simplefilter("ignore")
    model = _model(model_name)
    calibration = photo_crops(4, seed=1, photos=("grace_hopper",))
    evaluation = photo_crops(crops, seed=2, photos=("grace_hopper",))
    report = qinsight.diagnose(model, calibration, deploy=deploy, verify=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    began = time.perf_counter()
    resources = qinsight.types.Resources(shard="distributed" if distributed else None)
    plan = qinsight.plan(model, calibration, evaluation, goal=target, deploy=deploy, report=report, resources=resources)
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if distributed:
        torch.distributed.destroy_process_group()
    decided = attrs.evolve(plan, cost=None, evaluations=0)  # what it cost to make is not the plan
    fields = {field.name: repr(getattr(decided, field.name)) for field in attrs.fields(type(decided))}
    return {
        "rank": int(os.environ.get("RANK", 0)),
        "peak_mb": peak - before,
        "process_peak_mb": peak,
        "seconds": seconds,
        "evaluations": plan.evaluations,
        "floats": len(plan.kept_float),
        "cost": plan.cost.describe() if plan.cost is not None else "",
        "plan": {name: hashlib.sha256(text.encode()).hexdigest()[:12] for name, text in fields.items()},
    }


def _child(crops: int, deploy: str, ranks: int, threads: int, model: str, target: str) -> list[dict[str, object]]:
    """One plan in a process of its own, or under torchrun over ``ranks`` ranks: each rank's row."""
    command = [__file__, "--deploy", deploy, "--child", str(crops), "--threads", str(threads), "--model", model]
    command += ["--target", target]
    if ranks > 1:
        command = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *command, "--rank"]
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return sorted(rows, key=lambda row: row["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploy", default="fx", help="a backend's or a flow's name, as plan(deploy=) takes it")
    parser.add_argument("--crops", default="8,32", help="the evaluation crops of each plan, comma separated")
    parser.add_argument("--ranks", type=int, default=1, help="each plan under torchrun over this many ranks too")
    parser.add_argument("--model", default="mobilenet_v2", choices=("mobilenet_v2", "resnet50"))
    parser.add_argument("--target", default="top1>=0.9", help="the plan's target, as plan(goal=) takes it")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.deploy, args.rank, args.threads, args.model, args.target)))
        return
    # torch's kernels round otherwise at another thread count (a crop's top-1 can flip), so the plan the
    # ranks (one thread each, the machine's 2 cores) must equal is one process's on one thread
    threads = 1 if args.ranks > 1 else 2
    crops_asked = (int(n) for n in args.crops.split(","))
    found = {crops: _child(crops, args.deploy, 1, threads, args.model, args.target)[0] for crops in crops_asked}
    first = found[min(found)]
    for crops, row in found.items():
        memory = row["peak_mb"] / first["peak_mb"]
        print(
            f"{args.model}, {args.deploy}, {crops:3d} crops, one process, {threads} thread(s): "
            f"peak +{row['peak_mb']:7.0f} MB ({memory:.2f}x; the process {row['process_peak_mb'] / 1024:.2f} GB), "
            f"{row['seconds']:6.1f} s ({row['seconds'] / first['seconds']:.2f}x), {row['evaluations']} evaluations, "
            f"{row['floats']} sites in float"
        )
        print(f"  time: {row['cost']}")
        if args.ranks > 1:
            for rank in _child(crops, args.deploy, args.ranks, 1, args.model, args.target):
                differ = [name for name, digest in rank["plan"].items() if row["plan"].get(name) != digest]
                same = "the one process's plan" if not differ else f"ANOTHER PLAN: {', '.join(differ)} differ"
                print(
                    f"  rank {rank['rank']} of {args.ranks}: peak +{rank['peak_mb']:7.0f} MB "
                    f"({rank['peak_mb'] / row['peak_mb']:.2f}x one process's), {rank['seconds']:6.1f} s, {same}"
                )


if __name__ == "__main__":
    main()
