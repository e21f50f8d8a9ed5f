"""Example models, not part of the diagnostics: what ``qinsight diagnose --example`` runs, and what
the tests, benchmarks and examples/ scripts use.

- :mod:`.builtin`: seeded small models with their calibration data (``cnn``, ``encoder``, ``resnet18``);
- :mod:`.mobilenet`: MobileNetV2 with real ImageNet weights (an offline package);
- :mod:`.minilm`: all-MiniLM-L6-v2, a BERT encoder with real weights (the ``minilm`` extra);
- :mod:`.digits`: a small CNN trained on scikit-learn's handwritten digits, true labels (the ``digits`` extra).
"""

from qinsight.examples.builtin import (
    EXAMPLES,
    EncoderLayer,
    Example,
    ResNet18,
    SmallCNN,
    TinyEncoder,
    example,
)
from qinsight.examples.mobilenet import MobileNetV2, load_mobilenet_v2

__all__ = [
    "EXAMPLES",
    "EncoderLayer",
    "Example",
    "MobileNetV2",
    "ResNet18",
    "SmallCNN",
    "TinyEncoder",
    "example",
    "load_mobilenet_v2",
]
