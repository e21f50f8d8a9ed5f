"""qinsight: typed quantization diagnostics for PyTorch.

The one-step API is :func:`diagnose`; :func:`instrument` is the same for your
own calibration loop. Both return a :class:`Report`.
"""

from qinsight._version import __version__
from qinsight.detector import Detector
from qinsight.detectors import (
    ChannelStatus,
    DynamicStaticDetector,
    DynamicStaticFinding,
    EqualizationFinding,
    InputWeightEqualizationDetector,
    OutlierDetector,
    OutlierFinding,
    PerChannelDetector,
    PerChannelFinding,
    Stationarity,
)
from qinsight.candidates import compare_configs
from qinsight.comparison import (
    ActivationComparison,
    Comparison,
    ConfigComparison,
    ConfigScore,
    LayerActivationComparison,
    LayerConfigRow,
    LayerWeightComparison,
    WeightComparison,
)
from qinsight.diff import ReportDiff, diff_reports
from qinsight.equalization import EqualizationEntry, EqualizationMapping
from qinsight.errors import (
    CalibrationError,
    FrontendError,
    InvalidParameterError,
    ObserverError,
    QinsightError,
)
from qinsight.findings import Finding
from qinsight.numeric import compare_activations, compare_weights
from qinsight.pipeline import Session, comparison_report, default_detectors, diagnose, instrument
from qinsight.errors import PluginLoadError
from qinsight.report import DetectorFailure, DetectorResult, FailureStage, Parameter, Report, ReportMetadata
from qinsight.serde import RawFinding, ReportFileError, ReportVersionError, load_report, save_report
from qinsight.sites import InsertPoint, ObserverSpec, OpKind, OpSite, Side, WeightScheme
from qinsight.stats import ActivationStats, BatchMoments, DataCondition, Observation, ObservedStats
from qinsight.suggestions import ActivationMode, QuantSuggestion, SuggestionConflict

__all__ = [
    "ActivationComparison",
    "ActivationMode",
    "ActivationStats",
    "BatchMoments",
    "CalibrationError",
    "Comparison",
    "ConfigComparison",
    "ConfigScore",
    "ChannelStatus",
    "DataCondition",
    "Detector",
    "DetectorFailure",
    "DetectorResult",
    "DynamicStaticDetector",
    "DynamicStaticFinding",
    "EqualizationEntry",
    "EqualizationFinding",
    "EqualizationMapping",
    "FailureStage",
    "Finding",
    "FrontendError",
    "InputWeightEqualizationDetector",
    "LayerConfigRow",
    "InsertPoint",
    "InvalidParameterError",
    "LayerActivationComparison",
    "LayerWeightComparison",
    "ObservedStats",
    "Observation",
    "ObserverError",
    "ObserverSpec",
    "OpKind",
    "OpSite",
    "OutlierDetector",
    "OutlierFinding",
    "Parameter",
    "PerChannelDetector",
    "PerChannelFinding",
    "PluginLoadError",
    "QinsightError",
    "QuantSuggestion",
    "RawFinding",
    "Report",
    "ReportFileError",
    "ReportDiff",
    "ReportMetadata",
    "ReportVersionError",
    "Session",
    "Side",
    "Stationarity",
    "SuggestionConflict",
    "WeightComparison",
    "WeightScheme",
    "__version__",
    "compare_activations",
    "compare_configs",
    "compare_weights",
    "comparison_report",
    "default_detectors",
    "diagnose",
    "diff_reports",
    "instrument",
    "load_report",
    "save_report",
]
