"""Float vs quantized, layer by layer, for FX and PT2E quantization and torchao's ``quantize_``.

- :mod:`.metric_functions`: the built-in metrics and plugin metrics (``qinsight.metrics`` entry points);
- :mod:`.layers`: a quantized model's Linear/Conv layers behind one interface
  (``convert_fx`` modules, ``convert_pt2e`` graph nodes, modules with ``quantize_``d weights);
- :mod:`.torchao_weights`: torchao's quantized weights recognized and described, without importing torchao;
- :mod:`.accumulate`: kept outputs and error sums over batches (the hot path);
- :mod:`.weights`: :func:`compare_weights`;
- :mod:`.activations`: :func:`compare_activations`, :func:`measure_activations`;
- :mod:`.programs`: what every backend's lowering shares (a converted model run as its program, its
  size, its time); each backend's ``Lowering`` is its record's (:mod:`qinsight.backends`);
- :mod:`.parity`: each layer's lowered kernel against the reference's, alone and propagated;
- :mod:`.lowered`: :func:`compare_lowered`, the lowered program against the reference and the float model.

The results are the torch-free types of :mod:`qinsight.core.comparison`. Candidate configs quantized
for real and compared (:func:`qinsight.compare_configs`) are the pipeline's
(:mod:`qinsight.pipeline.config_comparison`): it prepares them through the flows of :mod:`qinsight.apply`.
"""

from qinsight.compare.activations import compare_activations, measure_activations
from qinsight.compare.lowered import compare_lowered
from qinsight.compare.metric_functions import load_metric, load_metrics
from qinsight.compare.weights import compare_weights, fold_batchnorm

__all__ = [
    "compare_activations",
    "compare_lowered",
    "compare_weights",
    "fold_batchnorm",
    "load_metric",
    "load_metrics",
    "measure_activations",
]
