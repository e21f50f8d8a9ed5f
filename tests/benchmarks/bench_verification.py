"""What verifying the report's config costs at diagnosis, and what it buys on inputs no calibration saw.

Per model and flow: ``diagnose`` without verification and with it (the wall times, their ratio), the
verdict (the flow's default, the report's config as suggested and as offered, on the held-out
calibration batches), and then, as a user would, the offered config, the config as the detectors said
it and the flow's default each quantized with ``qinsight.quantize`` and scored (SQNR of the outputs,
dB) on batches that neither calibration nor verification saw.

    python tests/benchmarks/bench_verification.py                  # cnn encoder resnet18 digits mobilenet_v2 minilm
    python tests/benchmarks/bench_verification.py --models cnn --flows fx
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import qinsight  # noqa: E402
from qinsight.compare.metric_functions import sqnr  # noqa: E402
from qinsight.compare.outputs import output_rows  # noqa: E402
from qinsight.examples.builtin import example  # noqa: E402
from qinsight.frontends import run_batch  # noqa: E402


def _model_and_data(name: str) -> tuple[nn.Module, list[Any], list[Any]]:
    from _data import photo_crops, sentence_batches
    from _real import minilm_or_skip, mobilenet_v2_or_skip

    if name == "mobilenet_v2":
        return mobilenet_v2_or_skip(), photo_crops(32, seed=0), photo_crops(16, seed=1)
    if name == "digits":
        from qinsight.examples.digits import digits_cnn

        trained = digits_cnn()
        return trained.model, list(trained.train_images[:512].split(64)), list(trained.test_images[:256].split(64))
    if name == "minilm":
        sentences = sentence_batches(8)
        return minilm_or_skip(), sentences[:4], sentences[4:]
    chosen = example(name)
    batches = chosen.data(12)
    return chosen.model(), batches[:8], batches[8:]


def _outputs(model: nn.Module, batches: list[Any]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([output_rows(run_batch(model, batch)) for batch in batches])


def _unseen(
    model: nn.Module, source: Any, calibration: list[Any], unseen: list[Any], reference: torch.Tensor, flow: str
) -> float:
    try:
        return sqnr(reference, _outputs(qinsight.quantize(model, source, calibration, flow=flow), unseen))
    except Exception:  # the config as the detectors said it may not run: that is what verification catches
        return float("-inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="cnn,encoder,resnet18,digits,mobilenet_v2,minilm")
    parser.add_argument("--flows", default="fx,pt2e")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    flows = tuple(args.flows.split(","))
    warm = example("cnn")
    qinsight.diagnose(warm.model(), warm.data(2), verify=flows)  # imports (torchao's too) out of the timings
    print(
        f"{'model':13} {'flow':5} {'diagnose':>9} {'+verify':>8} {'ratio':>6} | {'default':>8} {'suggested':>9} "
        f"{'offered':>8}"
        f" | unseen: {'default':>8} {'suggested':>9} {'offered':>8}  dropped"
    )
    for name in args.models.split(","):
        model, calibration, unseen = _model_and_data(name)
        model.eval()
        reference = _outputs(model, unseen)
        qinsight.diagnose(model, calibration, verify=False)  # this model's first trace out of the timings
        start = time.perf_counter()
        unverified = qinsight.diagnose(model, calibration, verify=False)
        plain = time.perf_counter() - start
        for flow in flows:
            start = time.perf_counter()
            report = qinsight.diagnose(model, calibration, verify=flow)
            verified = time.perf_counter() - start
            verdict = report.verification[0]
            default = qinsight.Advice(flow=flow, backend=report.metadata.backend, sites=report.sites)  # type: ignore[arg-type]
            scores = [
                _unseen(model, source, calibration, unseen, reference, flow) for source in (default, unverified, report)
            ]
            dropped = ", ".join(kind.value for kind in verdict.dropped) or "-"
            print(
                f"{name:13} {flow:5} {plain:8.1f}s {verified:7.1f}s {verified / plain:5.1f}x | {verdict.default:8.2f} "
                f"{verdict.suggested:9.2f} {verdict.score:8.2f} | unseen: {scores[0]:8.2f} {scores[1]:9.2f} "
                f"{scores[2]:8.2f}  "
                f"{dropped}{'; ' + verdict.error if verdict.error else ''}",
                flush=True,
            )


if __name__ == "__main__":
    main()
