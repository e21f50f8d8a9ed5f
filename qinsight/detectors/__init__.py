"""The built-in detectors."""

from qinsight.detectors.dynamic_static import DynamicStaticDetector, DynamicStaticFinding, Stationarity
from qinsight.detectors.equalization import EqualizationFinding, InputWeightEqualizationDetector
from qinsight.detectors.per_channel import PerChannelDetector, PerChannelFinding

__all__ = [
    "DynamicStaticDetector",
    "DynamicStaticFinding",
    "EqualizationFinding",
    "InputWeightEqualizationDetector",
    "PerChannelDetector",
    "PerChannelFinding",
    "Stationarity",
]
