"""The built-in detectors."""

from qinsight.detectors.dynamic_static import (
    DynamicStaticDetector,
    DynamicStaticFinding,
    Stationarity,
)
from qinsight.detectors.equalization_detector import (
    EqualizationFinding,
    InputWeightEqualizationDetector,
)
from qinsight.detectors.op_precision import PrecisionDetector, PrecisionFinding
from qinsight.detectors.outliers import ChannelStatus, OutlierDetector, OutlierFinding
from qinsight.detectors.per_channel import PerChannelDetector, PerChannelFinding
from qinsight.detectors.range_conflict import RangeConflictDetector, RangeConflictFinding

__all__ = [
    "ChannelStatus",
    "DynamicStaticDetector",
    "DynamicStaticFinding",
    "EqualizationFinding",
    "InputWeightEqualizationDetector",
    "OutlierDetector",
    "OutlierFinding",
    "PerChannelDetector",
    "PerChannelFinding",
    "PrecisionDetector",
    "PrecisionFinding",
    "RangeConflictDetector",
    "RangeConflictFinding",
    "Stationarity",
]
