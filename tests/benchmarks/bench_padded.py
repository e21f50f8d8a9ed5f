"""PaddedMobileNetV2 (MobileNetV2's real weights in a TensorFlow port's structure: padding Conv2d
subclasses, batch norms apart, one ReLU6 per block called twice) in each flow: the flow's default and the
report's verified config, on crops of photos the calibration never saw: SQNR against fp32 and top-1
agreement. What docs/verification.md's collapse section reads.

    python tests/benchmarks/bench_padded.py
"""

from __future__ import annotations

import copy
import math
import sys
import warnings
from pathlib import Path

import torch
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _data import photo_crops

import qinsight  # noqa: E402
from qinsight.backends.x86 import default_x86_quantizer
from qinsight.backends.xnnpack import default_xnnpack_quantizer  # noqa: E402
from qinsight.examples.mobilenet import load_padded_mobilenet_v2  # noqa: E402
from qinsight.frontends import separate_shared_calls  # noqa: E402


def _score(float_model: torch.nn.Module, quantized: torch.nn.Module, held: list[torch.Tensor]) -> str:
    with torch.no_grad():
        a = torch.cat([float_model(x) for x in held]).double()
        b = torch.cat([quantized(x) for x in held]).double()
    sqnr = 10 * math.log10(float((a**2).sum() / ((a - b) ** 2).sum()))
    return f"{sqnr:6.2f} dB, top-1 {float((a.argmax(1) == b.argmax(1)).float().mean()):.3f}"


def _fold_norms(model: torch.nn.Module) -> torch.nn.Module:
    """The batch norms folded into the convs before them, by hand: what the verification note advises."""
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    folded = copy.deepcopy(model)

    def fold(owner: nn.Module, conv: str, norm: str) -> None:
        fused = fuse_conv_bn_eval(getattr(owner, conv), getattr(owner, norm))
        getattr(owner, conv).weight, getattr(owner, conv).bias = fused.weight, fused.bias
        setattr(owner, norm, nn.Identity())

    fold(folded, "stem", "stem_bn")
    fold(folded, "head", "head_bn")
    for block in folded.blocks:
        if block.expand is not None:
            fold(block, "expand", "bn0")
        fold(block, "depthwise", "bn1")
        fold(block, "project", "bn2")
    return folded


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.backends.quantized.engine = "x86"
    photos = ("grace_hopper", "china", "flower")
    calibration = photo_crops(16, seed=1, batch=8, photos=photos)
    held = photo_crops(16, seed=2, batch=8, photos=photos)
    model = load_padded_mobilenet_v2()
    report = qinsight.diagnose(model, calibration, verify=("fx", "pt2e"))
    print("| flow | config | held out |")
    print("|---|---|---|")

    def fx(float_model: torch.nn.Module) -> torch.nn.Module:
        prepared = prepare_fx(copy.deepcopy(float_model), get_default_qconfig_mapping("x86"), (calibration[0],))
        with torch.no_grad():
            for batch in calibration:
                prepared(batch)
        return convert_fx(prepared)

    print(f"| FX | torch's default | {_score(model, fx(model), held)} |")
    print(f"| FX | the report's | {_score(model, qinsight.quantize(model, report, calibration, flow='fx'), held)} |")
    print(f"| FX | torch's default, batch norms folded first | {_score(model, fx(_fold_norms(model)), held)} |")

    def pt2e(quantizer: object) -> torch.nn.Module:
        exported = torch.export.export(copy.deepcopy(model), (calibration[0],)).module()
        prepared = prepare_pt2e(separate_shared_calls(exported), quantizer)  # type: ignore[arg-type]
        with torch.no_grad():
            for batch in calibration:
                prepared(batch)
        converted: torch.nn.Module = convert_pt2e(prepared)
        return converted

    for name, default in (("x86", default_x86_quantizer()), ("xnnpack", default_xnnpack_quantizer())):
        print(f"| PT2E {name} | its default quantizer | {_score(model, pt2e(default), held)} |")
    ours = qinsight.quantize(model, report, calibration, flow="pt2e")
    print(f"| PT2E x86 | the report's | {_score(model, ours, held)} |")
    for verdict in report.verification:
        for note in verdict.notes:
            print(f"\n{verdict.flow}: {note.kind.value}: {note.text}")


if __name__ == "__main__":
    main()
