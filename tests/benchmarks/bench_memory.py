"""Peak memory of calibration: float, prepare_fx, + torch's ModelReport, + qinsight.

Each variant runs in its own process (peak RSS is per process) and reports its
peak RSS minus the RSS before calibration, over 3 batches. Run by hand:
    python tests/benchmarks/bench_memory.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

VARIANTS = ("float", "prepare_fx", "torch ModelReport", "qinsight on float")
MODELS = ("resnet18", "encoder")


def measure(model_name: str, variant: str) -> float:
    """Runs in the child process: MB of peak RSS growth during calibration."""
    import copy
    import warnings

    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.fx._model_report import detector as d
    from torch.ao.quantization.fx._model_report.model_report import ModelReport
    from torch.ao.quantization.quantize_fx import prepare_fx

    import qinsight
    from qinsight.examples import EncoderLayer, ResNet18

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    torch.manual_seed(0)
    if model_name == "resnet18":
        model: torch.nn.Module = ResNet18().eval()
        batch = torch.randn(8, 3, 224, 224)
    else:
        model = torch.nn.Sequential(*(EncoderLayer(384, 12, 1536) for _ in range(6))).eval()
        batch = torch.randn(8, 128, 384)
    run: torch.nn.Module = model
    context = None
    if variant in ("prepare_fx", "torch ModelReport"):
        run = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), (batch,))
    if variant == "torch ModelReport":
        detectors = {d.PerChannelDetector("x86"), d.DynamicStaticDetector(), d.OutlierDetector()}  # type: ignore[no-untyped-call]
        if model_name == "resnet18":  # torch's equalization crashes on the encoder's 3-D inputs
            detectors.add(d.InputWeightEqualizationDetector(0.5))
        run = ModelReport(run, detectors).prepare_detailed_calibration()  # type: ignore[arg-type]
    if variant == "qinsight on float":
        context = qinsight.instrument(run)
        context.__enter__()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.no_grad():
        for _ in range(3):
            run(batch)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if context is not None:
        context.__exit__(None, None, None)
    return (after - before) / 1024.0  # ru_maxrss is in KiB on Linux


def main() -> None:
    if len(sys.argv) == 3:
        print(json.dumps(measure(sys.argv[1], sys.argv[2])))
        return
    for model_name in MODELS:
        print(f"\n{model_name}: peak RSS growth during 3 calibration batches (MB)")
        for variant in VARIANTS:
            out = subprocess.run(
                [sys.executable, __file__, model_name, variant], capture_output=True, text=True, check=True
            )
            print(f"  {variant:<18} {json.loads(out.stdout.strip().splitlines()[-1]):8.1f}")


if __name__ == "__main__":
    main()
