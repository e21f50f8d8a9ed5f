"""The contract a plugin is written against: import everything from here.

A detector plugin implements :class:`Detector` (its ``insert_points`` and
``analyze`` read a :class:`ModelView` and the frozen :class:`ObservedStats`)
and returns a :class:`DetectorResult` of its own :class:`Finding` subclass and
:class:`QuantSuggestion`\\ s. A metric plugin is a :class:`Metric`. A backend plugin (an ExecuTorch
delegate qinsight does not ship) is one :class:`Backend` record: its PT2E quantizers
(:class:`Pt2eQuantizers`) and its :class:`Lowering`. Each is registered as an entry point
(``qinsight.detectors``, ``qinsight.metrics``, ``qinsight.backends``); docs/plugins.md says how.
Nothing here imports torch.
"""

from qinsight.core.backend import Backend, Lowering, Program, Pt2eQuantizers
from qinsight.core.findings import Finding
from qinsight.core.precision import SideBits, activation_bits, bits_kept, side_bits
from qinsight.core.report import (
    DetectorFailure,
    DetectorResult,
    FailureStage,
    Parameter,
)
from qinsight.core.sites import (
    InsertPoint,
    ObserverSpec,
    OpKind,
    OpSite,
    Side,
    WeightScheme,
)
from qinsight.core.stats import (
    ActivationStats,
    DataCondition,
    Observation,
    ObservedStats,
    PercentileStats,
)
from qinsight.core.suggestions import ActivationMode, QuantSuggestion
from qinsight.plugin.detector import (
    API_VERSION,
    Detach,
    Detector,
    ModelView,
    parameters_of,
    result_of,
)
from qinsight.plugin.metric import ErrorTotals, Metric

__all__ = [
    "SideBits",
    "activation_bits",
    "bits_kept",
    "side_bits",
    "API_VERSION",
    "ActivationMode",
    "ActivationStats",
    "Backend",
    "DataCondition",
    "Detach",
    "Detector",
    "DetectorFailure",
    "DetectorResult",
    "ErrorTotals",
    "FailureStage",
    "Finding",
    "InsertPoint",
    "Lowering",
    "Metric",
    "ModelView",
    "Observation",
    "ObservedStats",
    "ObserverSpec",
    "OpKind",
    "OpSite",
    "Parameter",
    "PercentileStats",
    "Program",
    "Pt2eQuantizers",
    "QuantSuggestion",
    "Side",
    "WeightScheme",
    "parameters_of",
    "result_of",
]
