"""Float vs quantized on the built-in conv-bn CNN: FX and PT2E, two candidate configs, one report file.

Diagnoses the model, quantizes it with torch's x86 default (FX), compares weights
and activations layer by layer, ranks two candidate configs per layer (FX x86
and, when torchao is installed, PT2E's X86InductorQuantizer), and saves it all
as one report file that `qinsight show` prints. Run: python examples/compare.py [out.json]
"""

from __future__ import annotations

import copy
import sys
import tempfile
import warnings
from pathlib import Path

from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight
from qinsight.examples import example

warnings.filterwarnings("ignore")


def main() -> None:
    chosen = example("cnn")
    model, calibration, held_out = chosen.model(), chosen.data(8), chosen.data(4)
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), (calibration[0],))
    for batch in calibration:
        prepared(batch)
    quantized = convert_fx(prepared)

    configs: dict[str, object] = {"fx_x86": get_default_qconfig_mapping("x86")}
    try:
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

        configs["pt2e_x86"] = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    except ImportError:
        print("torchao is not installed: comparing the FX config only (pip install 'qinsight[pt2e]')")

    comparison = qinsight.Comparison(
        quantized="convert_fx, x86 default",
        weights=qinsight.compare_weights(model, quantized),
        activations=qinsight.compare_activations(model, quantized, held_out),
        configs=qinsight.compare_configs(model, configs, calibration, held_out),
    )
    report = qinsight.diagnose(model, calibration, model_name=chosen.name).with_comparison(comparison)
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "cnn-compared.json"
    qinsight.save_report(report, path)
    assert qinsight.load_report(path) == report
    print(qinsight.to_text(comparison))
    print(f"best config per layer: {comparison.configs.best() if comparison.configs else {}}")
    print(f"saved to {path}; print it again with: qinsight show {path}")


if __name__ == "__main__":
    main()
