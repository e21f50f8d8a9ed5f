"""The records qinsight's functions take and return, by the names a typed program imports.

Each is an immutable attrs class or an enum of the torch-free core (:mod:`qinsight.core`), so
``from qinsight.types import OpSite`` loads no torch. The top level (:mod:`qinsight`) keeps the few a
user names most (``Report``, ``QuantPlan``, ``FormatPlan``, the comparisons).
"""

from __future__ import annotations

from qinsight.core.advice import Advice
from qinsight.core.bias import BiasCorrection, BiasShift
from qinsight.core.comparison import (
    ActivationComparison,
    Comparison,
    ConfigComparison,
    ConfigScore,
    LayerActivationComparison,
    LayerConfigRow,
    LayerWeightComparison,
    LoweredComparison,
    MetricValue,
    ProgramCost,
    WeightComparison,
)
from qinsight.core.equalization import EqualizationEntry, EqualizationMapping
from qinsight.core.findings import Finding
from qinsight.core.formats import CurvePoint, FormatCost, FormatPlan, LayerFormat, OrderCheck, WeightFormat
from qinsight.core.fx_activations import FxActivations, NarrowedInput
from qinsight.core.metrics import MetricSpec
from qinsight.core.notes import Note, NoteKind
from qinsight.core.options import Deployment, Goal, Repairs, Resources
from qinsight.core.plan import (
    Budget,
    PlanCost,
    PlanPrograms,
    PlanStep,
    QuantPlan,
    SearchedOrder,
    SiteSensitivity,
    SpeedBound,
    StageTime,
    SuggestionCheck,
    Target,
)
from qinsight.core.precision import SideBits
from qinsight.core.progress import Progress
from qinsight.core.report import DetectorFailure, DetectorResult, FailureStage, Parameter, Report, ReportMetadata
from qinsight.core.shards import Shard
from qinsight.core.sites import (
    FlowName,
    Frontend,
    InsertPoint,
    ObserverSpec,
    OpCall,
    OpKind,
    OpSite,
    Side,
    WeightScheme,
)
from qinsight.core.smoothing import SmoothingEntry, SmoothingMapping
from qinsight.core.stats import ActivationStats, BatchMoments, DataCondition, Observation, ObservedStats
from qinsight.core.suggestions import ActivationMode, QuantSuggestion, SuggestionConflict
from qinsight.core.verification import ConfigVerification, KindCheck, SuggestionKind

__all__ = [
    "ActivationComparison",
    "BiasCorrection",
    "BiasShift",
    "ActivationMode",
    "ActivationStats",
    "Advice",
    "BatchMoments",
    "Budget",
    "Comparison",
    "ConfigComparison",
    "ConfigScore",
    "ConfigVerification",
    "CurvePoint",
    "DataCondition",
    "Deployment",
    "DetectorFailure",
    "DetectorResult",
    "EqualizationEntry",
    "EqualizationMapping",
    "FailureStage",
    "Finding",
    "FlowName",
    "FormatCost",
    "FormatPlan",
    "Frontend",
    "FxActivations",
    "Goal",
    "InsertPoint",
    "KindCheck",
    "LayerActivationComparison",
    "LayerConfigRow",
    "LayerFormat",
    "LayerWeightComparison",
    "LoweredComparison",
    "MetricSpec",
    "MetricValue",
    "NarrowedInput",
    "Note",
    "NoteKind",
    "Observation",
    "ObservedStats",
    "ObserverSpec",
    "OpCall",
    "OpKind",
    "OpSite",
    "OrderCheck",
    "Parameter",
    "PlanCost",
    "PlanPrograms",
    "PlanStep",
    "ProgramCost",
    "Progress",
    "QuantPlan",
    "QuantSuggestion",
    "Report",
    "ReportMetadata",
    "Repairs",
    "Resources",
    "SearchedOrder",
    "StageTime",
    "Shard",
    "Side",
    "SideBits",
    "SiteSensitivity",
    "SpeedBound",
    "SmoothingEntry",
    "SmoothingMapping",
    "SuggestionCheck",
    "SuggestionConflict",
    "SuggestionKind",
    "Target",
    "WeightComparison",
    "WeightFormat",
    "WeightScheme",
]
