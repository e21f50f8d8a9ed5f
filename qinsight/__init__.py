"""qinsight: typed quantization diagnostics for PyTorch.

The one-step API is :func:`diagnose`; :func:`instrument` is the same for your
own calibration loop. Both return a :class:`Report`. :func:`plan` finds what to
keep in float to reach a quality target; :func:`quantize` applies a report or a
plan (:mod:`qinsight.apply` builds every torch object from them).

The top level holds the verbs, the results a user names and :class:`QinsightError`;
the records are in :mod:`qinsight.types`, the errors in :mod:`qinsight.errors`, the
detectors in :mod:`qinsight.detectors`. Names are imported when first used (PEP 562),
so ``import qinsight`` and the torch-free core (:mod:`qinsight.core`) load neither
torch's quantization stack nor cattrs nor matplotlib until something needs them.
The layers, one subpackage each, are listed in docs/architecture.md.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

from qinsight._version import __version__ as __version__  # re-exported

_HERE = Path(__file__).parent


def _homes() -> dict[str, str]:
    """Each top-level name and the module it comes from, read from the stub type checkers see
    (``__init__.pyi``): the names are written once, there."""
    stub = ast.parse((_HERE / "__init__.pyi").read_text(encoding="utf-8"))
    return {
        alias.asname or alias.name: node.module
        for node in stub.body
        if isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names
    }


_HOMES = _homes()

# Names the top level held in 0.1.0 before it shrank; each still resolves for one release, with a
# DeprecationWarning naming its place.
_MOVED: dict[str, tuple[str, ...]] = {
    "qinsight.types": (
        "ActivationMode",
        "ActivationStats",
        "BatchMoments",
        "Budget",
        "ConfigScore",
        "ConfigVerification",
        "CurvePoint",
        "DataCondition",
        "DetectorFailure",
        "DetectorResult",
        "EqualizationEntry",
        "FailureStage",
        "Finding",
        "FlowName",
        "FormatCost",
        "Frontend",
        "FxActivations",
        "InsertPoint",
        "KindCheck",
        "LayerActivationComparison",
        "LayerConfigRow",
        "LayerFormat",
        "LayerWeightComparison",
        "MetricSpec",
        "MetricValue",
        "NarrowedInput",
        "Observation",
        "ObservedStats",
        "ObserverSpec",
        "OpCall",
        "OpKind",
        "OpSite",
        "OrderCheck",
        "Parameter",
        "PlanStep",
        "Progress",
        "QuantSuggestion",
        "ReportMetadata",
        "Shard",
        "Side",
        "SideBits",
        "SiteSensitivity",
        "SmoothingEntry",
        "SuggestionCheck",
        "SuggestionConflict",
        "SuggestionKind",
        "Target",
        "WeightFormat",
        "WeightScheme",
    ),
    "qinsight.errors": (
        "CalibrationError",
        "FrontendError",
        "InvalidParameterError",
        "MergeError",
        "MissingExtraError",
        "NotFoundError",
        "ObserverError",
        "PluginLoadError",
        "ReportFileError",
        "ReportVersionError",
        "ShardError",
        "UsageError",
    ),
    "qinsight.detectors": (
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
    ),
    "qinsight.plugin": ("Detector", "Metric", "ModelView"),
    "qinsight.pipeline": ("Session", "default_detectors"),
    "qinsight.outputs.serde": ("RawFinding",),
}
_MOVED_TO: dict[str, str] = {name: home for home, names in _MOVED.items() for name in names}


def _is_submodule(name: str) -> bool:
    """A public subpackage or module of qinsight (``qinsight.compare``, ``qinsight.types``...)."""
    return not name.startswith("_") and ((_HERE / name / "__init__.py").is_file() or (_HERE / f"{name}.py").is_file())


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    if _is_submodule(name):  # qinsight.compare.compare_weights and the like work without an import
        return importlib.import_module(f"qinsight.{name}")
    moved = _MOVED_TO.get(name)
    if moved is not None:
        warnings.warn(
            f"qinsight.{name} is now {moved}.{name}; the top-level name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(moved), name)
    raise AttributeError(f"module 'qinsight' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = sorted(_HOMES)
