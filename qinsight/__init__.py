"""qinsight: typed quantization diagnostics for PyTorch.

The one-step API is :func:`diagnose`; :func:`instrument` is the same for your
own calibration loop. Both return a :class:`Report`. :func:`plan` finds what to
keep in float to reach a quality target; :func:`quantize` applies a report or a
plan (:mod:`qinsight.apply` builds every torch object from them).

Names are imported when first used (PEP 562), so ``import qinsight`` and the
torch-free core (:mod:`qinsight.core`) load neither torch's quantization stack
nor cattrs nor matplotlib until something needs them. The layers, one
subpackage each, are listed in docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from qinsight._version import __version__

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use (``X as X``: re-exported for mypy; a test keeps it equal to _EXPORTS)
    from qinsight.core.activations import (
        FxActivations as FxActivations,
        NarrowedInput as NarrowedInput,
    )
    from qinsight.core.advice import (
        Advice as Advice,
        advice_of as advice_of,
    )
    from qinsight.core.comparison import (
        ActivationComparison as ActivationComparison,
        Comparison as Comparison,
        ConfigComparison as ConfigComparison,
        LoweredComparison as LoweredComparison,
        ConfigScore as ConfigScore,
        LayerActivationComparison as LayerActivationComparison,
        LayerConfigRow as LayerConfigRow,
        LayerWeightComparison as LayerWeightComparison,
        MetricValue as MetricValue,
        WeightComparison as WeightComparison,
    )
    from qinsight.core.equalization import (
        EqualizationEntry as EqualizationEntry,
        EqualizationMapping as EqualizationMapping,
    )
    from qinsight.core.errors import (
        CalibrationError as CalibrationError,
        FrontendError as FrontendError,
        InvalidParameterError as InvalidParameterError,
        MergeError as MergeError,
        MissingExtraError as MissingExtraError,
        NotFoundError as NotFoundError,
        ObserverError as ObserverError,
        PluginLoadError as PluginLoadError,
        QinsightError as QinsightError,
        ReportFileError as ReportFileError,
        ReportVersionError as ReportVersionError,
        ShardError as ShardError,
        UsageError as UsageError,
    )
    from qinsight.core.findings import (
        Finding as Finding,
    )
    from qinsight.core.formats import (
        Budget as Budget,
        CurvePoint as CurvePoint,
        FormatCost as FormatCost,
        FormatPlan as FormatPlan,
        LayerFormat as LayerFormat,
        OrderCheck as OrderCheck,
        WeightFormat as WeightFormat,
    )
    from qinsight.core.metrics import (
        MetricSpec as MetricSpec,
    )
    from qinsight.core.plan import (
        PlanStep as PlanStep,
        QuantPlan as QuantPlan,
        SiteSensitivity as SiteSensitivity,
        SuggestionCheck as SuggestionCheck,
        Target as Target,
    )
    from qinsight.core.precision import (
        SideBits as SideBits,
    )
    from qinsight.core.progress import (
        Progress as Progress,
    )
    from qinsight.core.report import (
        DetectorFailure as DetectorFailure,
        DetectorResult as DetectorResult,
        FailureStage as FailureStage,
        Parameter as Parameter,
        Report as Report,
        ReportMetadata as ReportMetadata,
    )
    from qinsight.core.shards import (
        Shard as Shard,
    )
    from qinsight.core.sites import (
        FlowName as FlowName,
        Frontend as Frontend,
        InsertPoint as InsertPoint,
        ObserverSpec as ObserverSpec,
        OpCall as OpCall,
        OpKind as OpKind,
        OpSite as OpSite,
        Side as Side,
        WeightScheme as WeightScheme,
    )
    from qinsight.core.smoothing import (
        SmoothingEntry as SmoothingEntry,
        SmoothingMapping as SmoothingMapping,
    )
    from qinsight.core.stats import (
        ActivationStats as ActivationStats,
        BatchMoments as BatchMoments,
        DataCondition as DataCondition,
        Observation as Observation,
        ObservedStats as ObservedStats,
    )
    from qinsight.core.suggestions import (
        ActivationMode as ActivationMode,
        QuantSuggestion as QuantSuggestion,
        SuggestionConflict as SuggestionConflict,
    )
    from qinsight.core.verification import (
        ConfigVerification as ConfigVerification,
        KindCheck as KindCheck,
        SuggestionKind as SuggestionKind,
    )
    from qinsight.plugin import (
        Detector as Detector,
        Metric as Metric,
        ModelView as ModelView,
    )
    from qinsight.distributed import (
        shard as shard,
    )
    from qinsight.detectors import (
        ChannelStatus as ChannelStatus,
        DynamicStaticDetector as DynamicStaticDetector,
        DynamicStaticFinding as DynamicStaticFinding,
        EqualizationFinding as EqualizationFinding,
        InputWeightEqualizationDetector as InputWeightEqualizationDetector,
        OutlierDetector as OutlierDetector,
        OutlierFinding as OutlierFinding,
        PerChannelDetector as PerChannelDetector,
        PerChannelFinding as PerChannelFinding,
        PrecisionDetector as PrecisionDetector,
        PrecisionFinding as PrecisionFinding,
        RangeConflictDetector as RangeConflictDetector,
        RangeConflictFinding as RangeConflictFinding,
        Stationarity as Stationarity,
    )
    from qinsight.compare import (
        compare_activations as compare_activations,
        compare_configs as compare_configs,
        compare_lowered as compare_lowered,
        compare_weights as compare_weights,
    )
    from qinsight.apply import (
        config_code as config_code,
        equalization_config as equalization_config,
        fqn_to_config as fqn_to_config,
        pt2e_quantizer as pt2e_quantizer,
        qconfig_mapping as qconfig_mapping,
        quantize as quantize,
        smoothed as smoothed,
    )
    from qinsight.pipeline import (
        Session as Session,
        comparison_report as comparison_report,
        default_detectors as default_detectors,
        diagnose as diagnose,
        instrument as instrument,
        merge_reports as merge_reports,
        verify_report as verify_report,
    )
    from qinsight.outputs.diff import (
        ReportDiff as ReportDiff,
        diff_reports as diff_reports,
    )
    from qinsight.outputs.serde import (
        RawFinding as RawFinding,
        load_report as load_report,
        save_report as save_report,
    )
    from qinsight.outputs.text import (
        to_text as to_text,
    )
    from qinsight.planning import (
        plan as plan,
        plan_formats as plan_formats,
    )

# The one list of public names, by the module that defines each: __all__, the lazy lookups and the
# TYPE_CHECKING imports above are all this list.
_EXPORTS: dict[str, tuple[str, ...]] = {
    'qinsight.core.activations': (
        'FxActivations',
        'NarrowedInput',
    ),
    'qinsight.core.advice': (
        'Advice',
        'advice_of',
    ),
    'qinsight.core.comparison': (
        'ActivationComparison',
        'Comparison',
        'ConfigComparison',
        'LoweredComparison',
        'ConfigScore',
        'LayerActivationComparison',
        'LayerConfigRow',
        'LayerWeightComparison',
        'MetricValue',
        'WeightComparison',
    ),
    'qinsight.core.equalization': (
        'EqualizationEntry',
        'EqualizationMapping',
    ),
    'qinsight.core.errors': (
        'CalibrationError',
        'FrontendError',
        'InvalidParameterError',
        'MergeError',
        'MissingExtraError',
        'NotFoundError',
        'ObserverError',
        'PluginLoadError',
        'QinsightError',
        'ReportFileError',
        'ReportVersionError',
        'ShardError',
        'UsageError',
    ),
    'qinsight.core.findings': (
        'Finding',
    ),
    'qinsight.core.formats': (
        'Budget',
        'CurvePoint',
        'FormatCost',
        'FormatPlan',
        'LayerFormat',
        'OrderCheck',
        'WeightFormat',
    ),
    'qinsight.core.metrics': (
        'MetricSpec',
    ),
    'qinsight.core.plan': (
        'PlanStep',
        'QuantPlan',
        'SiteSensitivity',
        'SuggestionCheck',
        'Target',
    ),
    'qinsight.core.precision': (
        'SideBits',
    ),
    'qinsight.core.progress': (
        'Progress',
    ),
    'qinsight.core.report': (
        'DetectorFailure',
        'DetectorResult',
        'FailureStage',
        'Parameter',
        'Report',
        'ReportMetadata',
    ),
    'qinsight.core.shards': (
        'Shard',
    ),
    'qinsight.core.sites': (
        'FlowName',
        'Frontend',
        'InsertPoint',
        'ObserverSpec',
        'OpCall',
        'OpKind',
        'OpSite',
        'Side',
        'WeightScheme',
    ),
    'qinsight.core.smoothing': (
        'SmoothingEntry',
        'SmoothingMapping',
    ),
    'qinsight.core.stats': (
        'ActivationStats',
        'BatchMoments',
        'DataCondition',
        'Observation',
        'ObservedStats',
    ),
    'qinsight.core.suggestions': (
        'ActivationMode',
        'QuantSuggestion',
        'SuggestionConflict',
    ),
    'qinsight.core.verification': (
        'ConfigVerification',
        'KindCheck',
        'SuggestionKind',
    ),
    'qinsight.plugin': (
        'Detector',
        'Metric',
        'ModelView',
    ),
    'qinsight.distributed': (
        'shard',
    ),
    'qinsight.detectors': (
        'ChannelStatus',
        'DynamicStaticDetector',
        'DynamicStaticFinding',
        'EqualizationFinding',
        'InputWeightEqualizationDetector',
        'OutlierDetector',
        'OutlierFinding',
        'PerChannelDetector',
        'PerChannelFinding',
        'PrecisionDetector',
        'PrecisionFinding',
        'RangeConflictDetector',
        'RangeConflictFinding',
        'Stationarity',
    ),
    'qinsight.compare': (
        'compare_activations',
        'compare_configs',
        'compare_lowered',
        'compare_weights',
    ),
    'qinsight.apply': (
        'config_code',
        'equalization_config',
        'fqn_to_config',
        'pt2e_quantizer',
        'qconfig_mapping',
        'quantize',
        'smoothed',
    ),
    'qinsight.pipeline': (
        'Session',
        'comparison_report',
        'default_detectors',
        'diagnose',
        'instrument',
        'merge_reports',
        'verify_report',
    ),
    'qinsight.outputs.diff': (
        'ReportDiff',
        'diff_reports',
    ),
    'qinsight.outputs.serde': (
        'RawFinding',
        'load_report',
        'save_report',
    ),
    'qinsight.outputs.text': (
        'to_text',
    ),
    'qinsight.planning': (
        'plan',
        'plan_formats',
    ),
}
_HOMES: dict[str, str] = {name: home for home, names in _EXPORTS.items() for name in names}


_LAYERS = (
    "core", "plugin", "observe", "distributed", "frontends", "detectors", "compare", "apply", "pipeline", "outputs",
    "planning", "examples", "cli",
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


__all__ = ["__version__", *sorted(_HOMES)]
