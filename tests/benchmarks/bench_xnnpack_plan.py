"""A plan for XNNPACK scored on the program that ships: ImageNet MobileNetV2 to a top-1 target.

``qinsight.diagnose(model, calibration, backend="xnnpack")`` (verified through XNNPACKQuantizer), then
``qinsight.plan(..., target="top1>=0.93", backend="xnnpack", lowered=True)``: every real score of the
plan is of the program lowered through ExecuTorch and run by its runtime. The plan's config is then
applied as a user would (``qinsight.quantize(model, plan, calibration)``), lowered and run on crops
of photos that neither calibration nor the plan saw (``compare_lowered``).

The crops to calibrate and plan on are of scikit-image's seven natural photos, the held-out crops of
three others (matplotlib's Grace Hopper, scikit-learn's China and flower): ``pip install scikit-learn
scikit-image`` first (``--plan-photos grace_hopper --held-out-photos grace_hopper`` needs neither).

    python tests/benchmarks/bench_xnnpack_plan.py
    python tests/benchmarks/bench_xnnpack_plan.py --target "top1>=0.9" --held-out 64
    python tests/benchmarks/bench_xnnpack_plan.py --evaluation 48 --confidence 0.95
    python tests/benchmarks/bench_xnnpack_plan.py --speed "speedup>=1.5"
    python tests/benchmarks/bench_xnnpack_plan.py --correct-biases   # the default's biases corrected first
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import qinsight  # noqa: E402


def main() -> None:
    from _data import photo_crops
    from _real import mobilenet_v2_or_skip

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="top1>=0.93")
    parser.add_argument("--speed", help="the program's speed bound beside the target, e.g. speedup>=1.5")
    parser.add_argument("--confidence", type=float, help="hold the top1 target at Wilson's bound (plan(confidence=))")
    parser.add_argument("--calibration", type=int, default=16, help="crops to calibrate on")
    parser.add_argument("--evaluation", type=int, default=32, help="crops the plan scores on")
    parser.add_argument("--held-out", type=int, default=64, help="crops of photos the plan never saw")
    parser.add_argument("--plan-photos", default="astronaut,chelsea,coffee,rocket,motorcycle,retina,hubble")
    parser.add_argument("--held-out-photos", default="grace_hopper,china,flower")
    parser.add_argument("--correct-biases", action="store_true", help="plan(repairs=Repairs(bias_correction=True))")
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    model = mobilenet_v2_or_skip().eval()
    seen, unseen = tuple(args.plan_photos.split(",")), tuple(args.held_out_photos.split(","))
    calibration = photo_crops(args.calibration, seed=1, photos=seen)
    evaluation = photo_crops(args.evaluation, seed=2, photos=seen)
    held_out = photo_crops(args.held_out, seed=3, photos=unseen)

    began = time.perf_counter()
    report = qinsight.diagnose(model, calibration, deploy="xnnpack")
    diagnosed = time.perf_counter() - began
    verdict = report.verification_for("pt2e")
    advice = type(qinsight.pt2e_quantizer(report).inner).__name__  # inside the wrapper that strips float sites
    print(f"diagnosed and verified in {diagnosed:.0f} s, advice {advice}: {verdict.describe() if verdict else '-'}")

    began = time.perf_counter()
    plan = qinsight.plan(
        model,
        calibration,
        evaluation,
        goal=qinsight.types.Goal(target=args.target, confidence=args.confidence, speed=args.speed),
        deploy=qinsight.types.Deployment(backend="xnnpack", lowered=True),
        report=report,
        held_out_data=held_out,
        repairs=qinsight.types.Repairs(bias_correction=args.correct_biases),
    )
    planned = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KB on Linux: GB
    print(f"peak RSS of the process so far (model, data, diagnosis and plan): {peak:.2f} GB")
    print(f"planned in {planned:.0f} s ({plan.evaluations} evaluations), scored on {plan.lowered or 'the reference'}")
    if plan.cost is not None:
        print(f"  time: {plan.cost.describe()}")
        once = next(stage.seconds for stage in plan.cost.stages if stage.stage == "baseline")
        print(f"  the plan took {planned / once:.1f}x quantizing, lowering and scoring the default config once")
    if plan.programs is not None:
        print(f"  program: {plan.programs.describe()}")
    for note in plan.notes:
        print(f"  note: {note}")
    print(
        f"  reached {plan.reached}: default {plan.default_score:.4f}, verified {plan.verified_score:.4f}, "
        f"held out {plan.held_out_score:.4f}"
    )
    floats = plan.kept_float
    print(
        f"  {len(floats)} sites kept in float ({', '.join(floats[:6])}{' ...' if len(floats) > 6 else ''}); "
        f"quantized fraction of the layers' parameters {plan.quantized_fraction:.3f}"
    )

    quantized = qinsight.quantize(model, plan, calibration)
    shipped = qinsight.compare_lowered(model, quantized, held_out, metrics=("sqnr", "top1"), layers=False)
    for pair in ("lowered_vs_float", "reference_vs_float", "lowered_vs_reference"):
        print(
            f"  applied as a user would, {pair}: sqnr {shipped.metric(pair, 'sqnr'):.2f} dB, "
            f"top-1 {shipped.metric(pair, 'top1'):.4f}"
        )
    cost, floating = shipped.program, shipped.float_program
    if floating is not None:
        print(
            f"  ms per batch int8 {cost.latency_ms:.1f}, float {floating.latency_ms:.1f}; "
            f".pte {cost.size_bytes / 1e6:.2f} MB, float {floating.size_bytes / 1e6:.2f} MB"
        )


if __name__ == "__main__":
    main()
