"""The one-step API on the built-in transformer encoder, then quantization with the suggested config.

Quantizes the Linear layers twice, with torch's default static config and with
the report's suggestions, and prints the output SQNR of each against the
float model. Run: python examples/one_step.py
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.ao.quantization import QConfigMapping, get_default_qconfig
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight
from qinsight.examples import example

warnings.filterwarnings("ignore")


def output_sqnr(float_model: nn.Module, mapping: QConfigMapping, data: list[torch.Tensor]) -> float:
    """Mean SQNR (dB) of the model quantized with ``mapping`` against the float model."""
    prepared = prepare_fx(example("encoder").model(), mapping, (data[0],))
    for batch in data:
        prepared(batch)
    quantized = convert_fx(prepared)
    with torch.no_grad():
        values = [
            20 * torch.log10(ref.norm() / (ref - quantized(batch)).norm()).item()
            for batch in data
            for ref in [float_model(batch)]
        ]
    return sum(values) / len(values)


def main() -> None:
    chosen = example("encoder")
    model, data = chosen.model(), chosen.data(16)

    report = qinsight.diagnose(model, data, model_name=chosen.name)
    print(qinsight.to_text(report))

    qconfig = get_default_qconfig("x86")  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    static = QConfigMapping().set_object_type(nn.Linear, qconfig)
    suggested = qinsight.qconfig_mapping(report, base=QConfigMapping())  # only the modules the report names
    print(f"Linear layers, torch's default static int8: {output_sqnr(model, static, data):5.1f} dB")
    print(f"Linear layers, qinsight's suggested config: {output_sqnr(model, suggested, data):5.1f} dB")


if __name__ == "__main__":
    main()
