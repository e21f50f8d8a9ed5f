"""Bias correction on ImageNet MobileNetV2: the flow's default config against the verified report's, per backend.

Calibrated on 16 crops of scikit-image's seven photos, scored on 48 other crops of them and on 32 crops
of three photos neither saw (Grace Hopper, China, flower), as top-1 agreement with fp32 and SQNR (dB).
Per flow and backend: the flow's default config, the same with its biases corrected (the seconds measuring
took), and the report's verified config (``qinsight.diagnose(model, calibration,
deploy=backend, verify=flow)`` then ``qinsight.quantize(model, report, calibration, flow=flow)``; the
seconds diagnosing and verifying took). ``--lowered`` scores
XNNPACK's configs as the program the ExecuTorch runtime runs. Where ``nncf`` is installed, its
``quantize_pt2e`` with the same quantizer (its range estimation and fast bias correction) is a row too.

    pip install scikit-learn scikit-image
    python tests/benchmarks/bench_bias_correction.py
    python tests/benchmarks/bench_bias_correction.py --flows pt2e:xnnpack --lowered
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

import attrs
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import qinsight  # noqa: E402
from qinsight.apply.bias_correction import measure_bias_correction  # noqa: E402
from qinsight.apply.recipe import default_config, quantize_with  # noqa: E402
from qinsight.core.advice import Advice  # noqa: E402


def _scores(model: torch.nn.Module, quantized: torch.nn.Module, batches: list[torch.Tensor]) -> tuple[float, float]:
    with torch.no_grad():
        reference = torch.cat([model(b) for b in batches])
        ours = torch.cat([quantized(b) for b in batches])
    top1 = float((reference.argmax(1) == ours.argmax(1)).float().mean())
    sqnr = float(10 * torch.log10(reference.square().sum() / (reference - ours).square().sum()))
    return top1, sqnr


def _shipped(quantized: torch.nn.Module, backend: str, lowered: bool) -> torch.nn.Module:
    if not lowered:
        return quantized
    from qinsight.compare.programs import shipped
    from qinsight.core.backend import backend_lowering

    return shipped(quantized, backend_lowering("bench", backend))


def _nncf(
    model: torch.nn.Module, backend: str, calibration: list[torch.Tensor], bias_correction: bool
) -> torch.nn.Module | None:
    """NNCF's ``quantize_pt2e`` with the backend's default quantizer (its own range estimation), with its
    fast bias correction or none; ``None`` where ``nncf`` is not installed."""
    try:
        import nncf  # type: ignore[import-not-found]
        from nncf.experimental.torch.fx import quantize_pt2e  # type: ignore[import-not-found]
    except ImportError:
        return None
    quantizer, _ = default_config("pt2e", backend)
    exported = torch.export.export(model, (calibration[0],)).module()
    fast = True if bias_correction else None  # None: no bias correction (False: NNCF's slow one)
    return quantize_pt2e(exported, quantizer, nncf.Dataset(calibration), fast_bias_correction=fast)  # type: ignore[no-any-return]


def main() -> None:
    from _data import photo_crops
    from _real import mobilenet_v2_or_skip

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", default="pt2e:xnnpack,pt2e:x86,fx:x86", help="flow:backend pairs")
    parser.add_argument("--lowered", action="store_true", help="score XNNPACK's configs as ExecuTorch programs")
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    model = mobilenet_v2_or_skip().eval()
    seen = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle", "retina", "hubble")
    calibration = photo_crops(16, seed=1, photos=seen)
    evaluation = photo_crops(48, seed=2, photos=seen)
    held_out = photo_crops(32, seed=3, photos=("grace_hopper", "china", "flower"))
    runs_on = [*evaluation, *held_out]
    print(f"{'flow':12} {'config':38} {'top1 48':>8} {'held out':>8} {'dB 48':>6} {'dB held':>7} {'s':>6}")
    for pair in args.flows.split(","):
        flow, backend = pair.split(":")
        lowered = args.lowered and backend == "xnnpack"

        def row(name: str, quantized: Any, seconds: float, backend: str = backend, lowered: bool = lowered) -> None:
            ships = _shipped(quantized, backend, lowered)
            (top1, sqnr), (held, held_sqnr) = _scores(model, ships, evaluation), _scores(model, ships, held_out)
            print(
                f"{pair:12} {name:38} {top1:8.3f} {held:8.3f} {sqnr:6.2f} {held_sqnr:7.2f} {seconds:6.1f}", flush=True
            )

        default = Advice(flow=flow, backend=backend)  # type: ignore[arg-type]
        row("default", quantize_with(model, default, calibration, runs_on=runs_on), 0.0)
        began = time.perf_counter()
        correction = measure_bias_correction(model, default, calibration)
        measured = time.perf_counter() - began
        advice = attrs.evolve(default, bias_correction=correction)
        row("default, biases corrected", quantize_with(model, advice, calibration, runs_on=runs_on), measured)
        began = time.perf_counter()
        report = qinsight.diagnose(model, calibration, deploy=backend, verify=flow)
        diagnosed = time.perf_counter() - began
        verdict = report.verification_for(flow)  # type: ignore[arg-type]
        biased = verdict is not None and bool(verdict.applied_bias_correction.entries)
        said = "report's config (biases corrected)" if biased else "report's config"
        row(said, qinsight.quantize(model, report, calibration, flow=flow), diagnosed)  # type: ignore[arg-type]
        if flow == "pt2e":
            for bias_correction in (False, True):
                began = time.perf_counter()
                nncf_model = _nncf(model, backend, calibration, bias_correction)
                if nncf_model is None:
                    print(f"{pair:12} NNCF quantize_pt2e: not installed (pip install nncf)")
                    break
                said = "fast bias correction" if bias_correction else "no bias correction"
                row(f"NNCF quantize_pt2e, {said}", nncf_model, time.perf_counter() - began)


if __name__ == "__main__":
    main()
