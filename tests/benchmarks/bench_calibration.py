"""Calibration cost per batch: float forward, prepare_fx, torch's ModelReport, qinsight.

All variants live in one process and run round-robin on the same batch (2
warm-up rounds, then the median of ROUNDS), so machine noise hits them alike.
Prints seconds per batch and the ratios: torch's ModelReport (which needs a
prepare_fx model) against qinsight on the float model, which is what each
tool needs to produce a report, and both on the same prepare_fx model. Not a
test: run it by hand,
    python tests/benchmarks/bench_calibration.py [--stack]
The Llama-shaped stack runs first (on CUDA too, at width 4096 in fp32 and bf16, when a GPU is present);
--stack stops there.
qinsight runs its default detectors (six since the op detectors: the four torch has, and precision and
range conflict on the ops around the layers, found with the example batch); torch runs its four on the CNN
and three on the transformer, where its equalization detector crashes on
(batch, seq, features) Linear inputs (docs/divergences.md).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.fx._model_report import detector as torch_detectors
from torch.ao.quantization.fx._model_report.detector import DetectorBase
from torch.ao.quantization.fx._model_report.model_report import ModelReport
from torch.ao.quantization.quantize_fx import prepare_fx
from torch.fx import GraphModule

import qinsight
from qinsight.examples import EncoderLayer, ResNet18
from qinsight.examples.stack import llama_stack, stack_batches

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
ROUNDS = 5


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(EncoderLayer(384, 12, 1536) for _ in range(6)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


def torch_report_model(prepared: GraphModule, detectors: set[DetectorBase]) -> nn.Module:
    report = ModelReport(copy.deepcopy(prepared), detectors)
    return report.prepare_detailed_calibration()


def bench(name: str, model: nn.Module, batch: torch.Tensor, torch_equalization: bool) -> None:
    """qinsight runs its default detectors; torch its four where it can."""
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), (batch,))
    torch_set: set[DetectorBase] = {
        torch_detectors.PerChannelDetector("x86"),
        torch_detectors.DynamicStaticDetector(),  # type: ignore[no-untyped-call]
        torch_detectors.OutlierDetector(),
    }
    if torch_equalization:
        torch_set.add(torch_detectors.InputWeightEqualizationDetector(0.5))
    ours = list(qinsight.pipeline.default_detectors())
    # qinsight observes the prepared model (against torch) and the float model (against the float forward).
    # On the float model the example batch also finds the ops around the layers (adds, norms, softmax...),
    # which the precision and range-conflict detectors observe; a prepare_fx graph has no such sites.
    instrumented, float_instrumented = copy.deepcopy(prepared), copy.deepcopy(model)
    with contextlib.ExitStack() as stack:
        sessions = [
            stack.enter_context(qinsight.instrument(m, detectors=ours, example_inputs=batch))
            for m in (instrumented, float_instrumented)
        ]
        variants: dict[str, Callable[[torch.Tensor], object]] = {
            "float": model,
            "prepare_fx": prepared,
            "torch ModelReport": torch_report_model(prepared, torch_set),
            "qinsight": instrumented,
            "qinsight on float": float_instrumented,
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        with torch.no_grad():
            for round_ in range(ROUNDS + 2):
                for key, run in variants.items():
                    start = time.perf_counter()
                    run(batch)
                    if round_ >= 2:
                        times[key].append(time.perf_counter() - start)
    # weight observations are read once, at freeze: one "batch" whatever ran
    observed = {
        o.stats.batches
        for session in sessions
        for o in session.stats().observations
        if o.side is not qinsight.types.Side.WEIGHT
    }
    if observed != {ROUNDS + 2}:
        raise RuntimeError(f"qinsight's observers saw {observed} batches, expected {ROUNDS + 2}")
    median = {k: statistics.median(v) for k, v in times.items()}
    theirs = ", ".join(sorted(type(d).__name__ for d in torch_set))
    print(f"\n{name}  median of {ROUNDS} rounds, s/batch")
    print(f"  qinsight: {', '.join(d.id for d in ours)}\n  torch:    {theirs}")
    print(f"  qinsight on float observes {len(sessions[1].view.sites)} layers and {len(sessions[1].view.ops)} ops")
    for key, value in median.items():
        print(f"  {key:<18} {value:7.3f}")
    observers_ours = median["qinsight"] - median["prepare_fx"]
    observers_torch = median["torch ModelReport"] - median["prepare_fx"]
    # torch's ModelReport needs a prepare_fx model; qinsight diagnoses the float model.
    print(
        "  torch ModelReport / qinsight on float:        "
        f"{median['torch ModelReport'] / median['qinsight on float']:5.2f}x"
    )
    print(f"  torch / qinsight, both on prepare_fx:         {median['torch ModelReport'] / median['qinsight']:5.2f}x")
    if observers_ours > 0.01 * median["prepare_fx"]:
        print(f"  observer overhead torch / qinsight:           {observers_torch / observers_ours:5.2f}x")
    else:
        print(f"  observer overhead: torch {observers_torch:.3f} s, qinsight below 1% of a batch (noise)")
    print(f"  qinsight on the float model / float forward:  {median['qinsight on float'] / median['float']:5.2f}x")


def bench_stack(device: str, dtype: torch.dtype, width: int, tokens: int) -> None:
    """The Llama-shaped stack (the GPU benchmark's shape, ../shared/gpu/llm_stack.py) at ``width``: the float
    forward against the same forward observed by qinsight's default detectors (torch's ModelReport cannot
    prepare it), per batch. On CUDA each timing waits for the device, once per batch."""
    mlp = (width * 11) // 4 // 64 * 64  # 1,408 at 512 and 11,008 at 4096, as Llama's
    model = llama_stack(width=width, mlp=mlp).to(device=device, dtype=dtype).eval()
    batches = [b.to(device=device, dtype=dtype) for b in stack_batches(width=width, tokens=tokens, count=ROUNDS + 2)]
    observed = llama_stack(width=width, mlp=mlp).to(device=device, dtype=dtype).eval()
    times: dict[str, list[float]] = {"float": [], "qinsight": []}
    with qinsight.instrument(observed, example_inputs=batches[0]) as session, torch.no_grad():
        for round_, batch in enumerate(batches):
            for key, run in (("float", model), ("qinsight", observed)):
                start = time.perf_counter()
                run(batch)
                if device == "cuda":
                    torch.cuda.synchronize()
                if round_ >= 2:
                    times[key].append(time.perf_counter() - start)
        syncs = _synchronizations(observed, batches[0]) if device == "cuda" else 0
        start = time.perf_counter()
        session.report()
        report_seconds = time.perf_counter() - start
    median = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"\nLlama-shaped stack, width {width}, MLP {mlp}, 4 layers, 1x{tokens} tokens, {device} {dtype}  median of "
        f"{ROUNDS}, s/batch"
    )
    for key, value in median.items():
        print(f"  {key:<18} {value:7.4f}")
    print(f"  qinsight on the float model / float forward:  {median['qinsight'] / median['float']:5.2f}x")
    print(f"  session.report()   {report_seconds:7.2f} s")
    if device == "cuda":
        print(f"  synchronizing calls in one observed batch: {syncs}")


def _synchronizations(model: nn.Module, batch: torch.Tensor) -> int:
    """The calls that made the host wait for the GPU during one forward (torch's sync debug mode)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model(batch)
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def main() -> None:
    parser = argparse.ArgumentParser(description="calibration cost per batch against the float forward")
    parser.add_argument("--stack", action="store_true", help="the Llama-shaped stack only (CPU, and CUDA when present)")
    stack_only = parser.parse_args().stack
    torch.manual_seed(0)
    bench_stack("cpu", torch.float32, width=512, tokens=256)
    if torch.cuda.is_available():
        for dtype in (torch.float32, torch.bfloat16):
            bench_stack("cuda", dtype, width=4096, tokens=2048)
    if stack_only:
        return
    bench("ResNet-18-like CNN, 8x3x224x224", ResNet18().eval(), torch.randn(8, 3, 224, 224), torch_equalization=True)
    # torch's equalization detector crashes on (batch, seq, features) inputs: it runs three detectors here.
    bench(
        "6-layer transformer encoder, d=384, seq 128, batch 8",
        Encoder().eval(),
        torch.randn(8, 128, 384),
        torch_equalization=False,
    )


if __name__ == "__main__":
    main()
