"""A plan's peak memory and time against the evaluation data it scores on: MobileNetV2, real weights.

Each plan runs in its own process (peak RSS is per process), on 4 calibration crops and N evaluation
crops, to ``top1>=0.9``; printed per N: the peak RSS over what the process held before planning, the
seconds, the evaluations (whole forwards of the simulation), and the ratio of memory and time to the
smallest N. A plan whose memory grows with N shows it here.

    python tests/benchmarks/bench_plan_memory.py
    python tests/benchmarks/bench_plan_memory.py --deploy xnnpack --crops 8,24,48
    PYTHONPATH=/path/to/another/checkout python tests/benchmarks/bench_plan_memory.py   # the same, there

Run it on an idle machine: each plan takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def measure(crops: int, deploy: str) -> dict[str, object]:
    """In the child process: one plan on ``crops`` evaluation crops, its peak RSS growth in MB."""
    import resource
    import time
    import warnings

    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from _data import photo_crops
    from _real import mobilenet_v2_or_skip

    import qinsight

    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    model = mobilenet_v2_or_skip().eval()
    calibration = photo_crops(4, seed=1, photos=("grace_hopper",))
    evaluation = photo_crops(crops, seed=2, photos=("grace_hopper",))
    report = qinsight.diagnose(model, calibration, deploy=deploy, verify=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    began = time.perf_counter()
    plan = qinsight.plan(model, calibration, evaluation, goal="top1>=0.9", deploy=deploy, report=report)
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "peak_mb": peak - before,
        "seconds": seconds,
        "evaluations": plan.evaluations,
        "floats": len(plan.kept_float),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploy", default="fx", help="a backend's or a flow's name, as plan(deploy=) takes it")
    parser.add_argument("--crops", default="8,32", help="the evaluation crops of each plan, comma separated")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.deploy)))
        return
    found = {}
    for crops in (int(n) for n in args.crops.split(",")):
        command = [sys.executable, __file__, "--deploy", args.deploy, "--child", str(crops)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        found[crops] = json.loads(done.stdout.strip().splitlines()[-1])
    first = found[min(found)]
    for crops, row in found.items():
        memory = row["peak_mb"] / first["peak_mb"]
        print(
            f"{args.deploy}, {crops:3d} crops: peak +{row['peak_mb']:7.0f} MB ({memory:.2f}x), "
            f"{row['seconds']:6.1f} s ({row['seconds'] / first['seconds']:.2f}x), {row['evaluations']} evaluations, "
            f"{row['floats']} sites in float"
        )
        if row["cost"]:
            print(f"  time: {row['cost']}")


if __name__ == "__main__":
    main()
