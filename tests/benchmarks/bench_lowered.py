"""What the lowered program computes and costs, against the reference model it was lowered from.

Per model and backend, as a user would: quantize with the backend's PT2E quantizer (XNNPACKQuantizer,
symmetric per-channel, static or dynamic; X86InductorQuantizer's default), calibrate, convert, then
``qinsight.compare_lowered`` on batches no calibration saw: the outputs of the lowered program, the
reference and fp32 against each other (SQNR, and top-1 agreement with fp32 for MobileNetV2, cosine for
MiniLM), the layers and ops whose lowered kernel departs most from the reference (local and
propagated), latency per sample of the int8 and the float programs, and their sizes.

    python tests/benchmarks/bench_lowered.py                                  # every case below
    python tests/benchmarks/bench_lowered.py --cases mobilenet_v2:xnnpack
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import qinsight  # noqa: E402
import qinsight.backends.x86  # noqa: E402
from qinsight.compare.outputs import output_rows  # noqa: E402
from qinsight.frontends import example_inputs  # noqa: E402

CASES = ("mobilenet_v2:xnnpack", "mobilenet_v2:x86", "minilm:xnnpack", "minilm:xnnpack-dynamic")


def _padded(batches: list[dict[str, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sentence batches padded to one length: a lowered program takes the shape it was lowered for."""
    length = max(batch["input_ids"].shape[1] for batch in batches)

    def pad(value: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(value, (0, length - value.shape[1]))

    return [(pad(batch["input_ids"]), pad(batch["attention_mask"])) for batch in batches]


def _model_and_data(name: str) -> tuple[nn.Module, list[Any], list[Any]]:
    from _data import photo_crops, sentence_batches
    from _real import minilm_or_skip, mobilenet_v2_or_skip

    if name == "mobilenet_v2":
        return mobilenet_v2_or_skip(), photo_crops(16, seed=0), photo_crops(32, seed=1)
    sentences = _padded(sentence_batches())  # 6 batches of 8 real sentences
    return minilm_or_skip(), sentences[:3], sentences[3:]


def _quantizer(backend: str) -> Any:
    if backend == "x86":
        return qinsight.backends.x86.default_x86_quantizer()
    from executorch.backends.xnnpack.quantizer import xnnpack_quantizer as xnnpack

    config = xnnpack.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=backend.endswith("dynamic"))
    return xnnpack.XNNPACKQuantizer().set_global(config)


def _reference(model: nn.Module, quantizer: Any, calibration: list[Any]) -> nn.Module:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    example = example_inputs(calibration[0])
    prepared = prepare_pt2e(torch.export.export(copy.deepcopy(model), example).module(), quantizer)
    for batch in calibration:
        prepared(*example_inputs(batch))
    converted: nn.Module = convert_pt2e(prepared)
    return converted


def _run(case: str) -> None:
    name, backend = case.split(":")
    model, calibration, held_out = _model_and_data(name)
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = _reference(model, _quantizer(backend), calibration)
        start = time.perf_counter()
        metrics = ("sqnr", "cosine", "top1") if name == "mobilenet_v2" else ("sqnr", "cosine")
        lowered = qinsight.compare_lowered(
            model, reference, held_out, backend=backend.partition("-")[0], metrics=metrics
        )
        seconds = time.perf_counter() - start
    samples = output_rows(model(*example_inputs(held_out[0]))).shape[0]
    print(f"== {case}: {lowered.runtime}; {lowered.batches} held-out batches of {samples}, compared in {seconds:.0f} s")
    for pair in ("lowered_vs_reference", "lowered_vs_float", "reference_vs_float"):
        top1 = f"  top-1 agreement {lowered.metric(pair, 'top1'):.3f}" if name == "mobilenet_v2" else ""
        print(f"  {pair:22s} sqnr {lowered.metric(pair):6.2f} dB  cosine {lowered.metric(pair, 'cosine'):.4f}{top1}")
    assert lowered.float_program is not None
    print(
        f"  int8 program {lowered.program.latency_ms / samples:.2f} ms per sample, "
        f"{lowered.program.size_bytes / 1e6:.2f} MB; "
        f"float program {lowered.float_program.latency_ms / samples:.2f} ms, "
        f"{lowered.float_program.size_bytes / 1e6:.2f} MB "
        f"(speed-up {lowered.speedup:.2f}x, size {lowered.size_ratio:.2f}x)"
    )
    print(f"  {len(lowered.layers)} layers and ops lowered alone; worst local (dB, propagated dB, max steps):")
    for layer in lowered.worst(5):
        steps = "float" if layer.max_steps is None else f"{layer.max_steps:.0f}"
        print(f"    {layer.fqn:44s} {layer.kind:12s} {layer.sqnr:6.1f} {layer.propagated:6.1f} {steps}")
    if lowered.layers:
        print(
            f"  worst local of any kernel {lowered.worst(1)[0].sqnr:.1f} dB; lowest propagated "
            f"{min(layer.propagated for layer in lowered.layers):.1f} dB; not lowered alone: {len(lowered.unlowered)}"
        )


def main(cases: Sequence[str] = CASES, run: Callable[[str], None] = _run) -> None:
    """Run the ``--cases`` asked among ``cases`` (default all), each by ``run``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="*", default=list(cases), choices=cases)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for case in args.cases:
        run(case)


if __name__ == "__main__":
    main()
