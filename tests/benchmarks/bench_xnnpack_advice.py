"""The report's advice for XNNPACK, applied as a user would and measured where it runs.

Per real-weight model: ``qinsight.diagnose(model, calibration, backend="xnnpack")`` (verified through
XNNPACKQuantizer), then XNNPACK's own default (symmetric per-channel static) and the report's
``qinsight.quantize(model, report, calibration)`` (its XNNPACKQuantizer), each lowered through ExecuTorch
and run by its runtime on batches no calibration saw (``compare_lowered``, outputs only): SQNR and the
task metric against fp32, and what the verification measured on its own held-out calibration batches.

    python tests/benchmarks/bench_xnnpack_advice.py                       # every case
    python tests/benchmarks/bench_xnnpack_advice.py --cases mobilenet_v2
"""

from __future__ import annotations

import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_lowered import _model_and_data, _quantizer, _reference, main  # noqa: E402

import qinsight  # noqa: E402

CASES = {"mobilenet_v2": ("sqnr", "top1"), "minilm": ("sqnr", "cosine")}


def _run(name: str) -> None:
    model, calibration, held_out = _model_and_data(name)
    model.eval()
    metrics = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        report = qinsight.diagnose(model, calibration, deploy="xnnpack")
        diagnosed = time.perf_counter() - start
        converted = {
            "XNNPACK default": _reference(model, _quantizer("xnnpack"), calibration),
            "the report's": qinsight.quantize(model, report, calibration),
        }
        shipped = {
            label: qinsight.compare_lowered(
                model, reference, held_out, metrics=metrics, layers=False, float_program=False
            )
            for label, reference in converted.items()
        }
    verdict = report.verification_for("pt2e")
    assert verdict is not None
    print(f"== {name}: diagnosed and verified in {diagnosed:.0f} s; {verdict.describe()}")
    kinds = sorted({s.describe() for s in report.suggestions})
    print(f"  the report's suggestions: {len(report.suggestions)} layers ({'; '.join(kinds[:4])})")
    for label, lowered in shipped.items():
        values = "  ".join(
            f"{metric} {lowered.metric(pair, metric):.4g}"
            for pair in ("lowered_vs_float", "reference_vs_float")
            for metric in metrics
        )
        print(f"  {label:16s} program vs fp32 / reference vs fp32: {values}")


if __name__ == "__main__":
    main(tuple(CASES), _run)
