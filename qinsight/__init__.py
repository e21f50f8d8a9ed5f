"""qinsight: typed quantization diagnostics for PyTorch.

The one-step API is :func:`diagnose`; :func:`instrument` is the same for your
own calibration loop. Both return a :class:`Report`.

Names are imported when first used (PEP 562), so ``import qinsight`` and the
torch-free core (:mod:`qinsight.core`) load neither torch's quantization stack
nor cattrs nor matplotlib until something needs them. The layers, one
subpackage each, are listed in docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from qinsight._version import __version__

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use
    from qinsight.compare import compare_activations, compare_configs, compare_weights
    from qinsight.core.comparison import (
        ActivationComparison,
        Comparison,
        ConfigComparison,
        ConfigScore,
        LayerActivationComparison,
        LayerConfigRow,
        LayerWeightComparison,
        MetricValue,
        WeightComparison,
    )
    from qinsight.core.activations import FxActivations, NarrowedInput
    from qinsight.core.equalization import EqualizationEntry, EqualizationMapping
    from qinsight.core.errors import (
        CalibrationError,
        FrontendError,
        InvalidParameterError,
        MergeError,
        MissingExtraError,
        ObserverError,
        PluginLoadError,
        QinsightError,
        ReportFileError,
        ReportVersionError,
        ShardError,
        UsageError,
    )
    from qinsight.core.findings import Finding
    from qinsight.core.precision import SideBits
    from qinsight.core.report import (
        DetectorFailure,
        DetectorResult,
        FailureStage,
        Parameter,
        Report,
        ReportMetadata,
    )
    from qinsight.core.sites import (
        InsertPoint,
        ObserverSpec,
        OpKind,
        OpCall,
        OpSite,
        Side,
        WeightScheme,
    )
    from qinsight.core.stats import (
        ActivationStats,
        BatchMoments,
        DataCondition,
        Observation,
        ObservedStats,
    )
    from qinsight.core.suggestions import (
        ActivationMode,
        QuantSuggestion,
        SuggestionConflict,
    )
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
        PrecisionDetector,
        PrecisionFinding,
        RangeConflictDetector,
        RangeConflictFinding,
        Stationarity,
    )
    from qinsight.outputs.diff import ReportDiff, diff_reports
    from qinsight.outputs.serde import RawFinding, load_report, save_report
    from qinsight.pipeline import (
        Session,
        comparison_report,
        default_detectors,
        diagnose,
        instrument,
        merge_reports,
    )
    from qinsight.core.shards import Shard
    from qinsight.core.plan import PlanStep, QuantPlan, SiteSensitivity, SuggestionCheck, Target
    from qinsight.core.smoothing import SmoothingEntry, SmoothingMapping
    from qinsight.distributed import shard
    from qinsight.planning import plan
    from qinsight.plugin import Detector, Metric, ModelView

_HOMES: dict[str, str] = {
    "ActivationComparison": "qinsight.core.comparison",
    "Comparison": "qinsight.core.comparison",
    "ConfigComparison": "qinsight.core.comparison",
    "ConfigScore": "qinsight.core.comparison",
    "LayerActivationComparison": "qinsight.core.comparison",
    "LayerConfigRow": "qinsight.core.comparison",
    "LayerWeightComparison": "qinsight.core.comparison",
    "MetricValue": "qinsight.core.comparison",
    "WeightComparison": "qinsight.core.comparison",
    "FxActivations": "qinsight.core.activations",
    "NarrowedInput": "qinsight.core.activations",
    "EqualizationEntry": "qinsight.core.equalization",
    "EqualizationMapping": "qinsight.core.equalization",
    "CalibrationError": "qinsight.core.errors",
    "FrontendError": "qinsight.core.errors",
    "InvalidParameterError": "qinsight.core.errors",
    "MergeError": "qinsight.core.errors",
    "MissingExtraError": "qinsight.core.errors",
    "ObserverError": "qinsight.core.errors",
    "PluginLoadError": "qinsight.core.errors",
    "QinsightError": "qinsight.core.errors",
    "ReportFileError": "qinsight.core.errors",
    "ReportVersionError": "qinsight.core.errors",
    "ShardError": "qinsight.core.errors",
    "UsageError": "qinsight.core.errors",
    "Finding": "qinsight.core.findings",
    "DetectorFailure": "qinsight.core.report",
    "DetectorResult": "qinsight.core.report",
    "FailureStage": "qinsight.core.report",
    "Parameter": "qinsight.core.report",
    "Report": "qinsight.core.report",
    "ReportMetadata": "qinsight.core.report",
    "InsertPoint": "qinsight.core.sites",
    "ObserverSpec": "qinsight.core.sites",
    "OpKind": "qinsight.core.sites",
    "OpCall": "qinsight.core.sites",
    "OpSite": "qinsight.core.sites",
    "Side": "qinsight.core.sites",
    "WeightScheme": "qinsight.core.sites",
    "ActivationStats": "qinsight.core.stats",
    "BatchMoments": "qinsight.core.stats",
    "DataCondition": "qinsight.core.stats",
    "Observation": "qinsight.core.stats",
    "ObservedStats": "qinsight.core.stats",
    "ActivationMode": "qinsight.core.suggestions",
    "QuantSuggestion": "qinsight.core.suggestions",
    "SuggestionConflict": "qinsight.core.suggestions",
    "Detector": "qinsight.plugin",
    "Metric": "qinsight.plugin",
    "ModelView": "qinsight.plugin",
    "ChannelStatus": "qinsight.detectors",
    "DynamicStaticDetector": "qinsight.detectors",
    "DynamicStaticFinding": "qinsight.detectors",
    "EqualizationFinding": "qinsight.detectors",
    "InputWeightEqualizationDetector": "qinsight.detectors",
    "OutlierDetector": "qinsight.detectors",
    "OutlierFinding": "qinsight.detectors",
    "PerChannelDetector": "qinsight.detectors",
    "PerChannelFinding": "qinsight.detectors",
    "SideBits": "qinsight.core.precision",
    "RangeConflictFinding": "qinsight.detectors",
    "RangeConflictDetector": "qinsight.detectors",
    "PrecisionFinding": "qinsight.detectors",
    "PrecisionDetector": "qinsight.detectors",
    "Stationarity": "qinsight.detectors",
    "compare_activations": "qinsight.compare",
    "compare_configs": "qinsight.compare",
    "compare_weights": "qinsight.compare",
    "Session": "qinsight.pipeline",
    "comparison_report": "qinsight.pipeline",
    "default_detectors": "qinsight.pipeline",
    "diagnose": "qinsight.pipeline",
    "instrument": "qinsight.pipeline",
    "merge_reports": "qinsight.pipeline",
    "Shard": "qinsight.core.shards",
    "PlanStep": "qinsight.core.plan",
    "QuantPlan": "qinsight.core.plan",
    "SiteSensitivity": "qinsight.core.plan",
    "SuggestionCheck": "qinsight.core.plan",
    "Target": "qinsight.core.plan",
    "SmoothingEntry": "qinsight.core.smoothing",
    "SmoothingMapping": "qinsight.core.smoothing",
    "plan": "qinsight.planning",
    "shard": "qinsight.distributed",
    "ReportDiff": "qinsight.outputs.diff",
    "diff_reports": "qinsight.outputs.diff",
    "RawFinding": "qinsight.outputs.serde",
    "load_report": "qinsight.outputs.serde",
    "save_report": "qinsight.outputs.serde",
}


_LAYERS = (
    "core", "plugin", "observe", "distributed", "frontends", "detectors", "compare", "pipeline", "outputs", "planning",
    "examples", "cli",
)


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        if name in _LAYERS:  # qinsight.compare.compare_weights and the like work without an import
            return importlib.import_module(f"qinsight.{name}")
        raise AttributeError(f"module 'qinsight' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "ActivationComparison",
    "ActivationMode",
    "ActivationStats",
    "BatchMoments",
    "CalibrationError",
    "ChannelStatus",
    "Comparison",
    "ConfigComparison",
    "ConfigScore",
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
    "FxActivations",
    "FrontendError",
    "InputWeightEqualizationDetector",
    "InsertPoint",
    "InvalidParameterError",
    "LayerActivationComparison",
    "LayerConfigRow",
    "LayerWeightComparison",
    "MergeError",
    "Metric",
    "MetricValue",
    "MissingExtraError",
    "ModelView",
    "NarrowedInput",
    "Observation",
    "ObservedStats",
    "ObserverError",
    "ObserverSpec",
    "OpKind",
    "OpCall",
    "OpSite",
    "OutlierDetector",
    "OutlierFinding",
    "Parameter",
    "PlanStep",
    "QuantPlan",
    "SiteSensitivity",
    "SmoothingEntry",
    "SmoothingMapping",
    "SuggestionCheck",
    "Target",
    "plan",
    "PerChannelDetector",
    "PerChannelFinding",
    "SideBits",
    "RangeConflictFinding",
    "RangeConflictDetector",
    "PrecisionFinding",
    "PrecisionDetector",
    "PluginLoadError",
    "QinsightError",
    "QuantSuggestion",
    "RawFinding",
    "Report",
    "ReportDiff",
    "ReportFileError",
    "ReportMetadata",
    "ReportVersionError",
    "Session",
    "Shard",
    "ShardError",
    "Side",
    "Stationarity",
    "SuggestionConflict",
    "UsageError",
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
    "merge_reports",
    "save_report",
    "shard",
]
