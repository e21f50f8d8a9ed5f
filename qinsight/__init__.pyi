# The one list of qinsight's top-level names: what type checkers see, and what qinsight/__init__.py
# reads at import to resolve each name lazily from the module written here (PEP 562). Records live
# in qinsight.types, errors in qinsight.errors, detectors in qinsight.detectors.

from qinsight._version import __version__ as __version__
from qinsight.apply import (
    config_code as config_code,
    equalization_config as equalization_config,
    fqn_to_config as fqn_to_config,
    pt2e_quantizer as pt2e_quantizer,
    qconfig_mapping as qconfig_mapping,
    quantize as quantize,
    smoothed as smoothed,
)
from qinsight.compare import (
    compare_activations as compare_activations,
    compare_configs as compare_configs,
    compare_lowered as compare_lowered,
    compare_weights as compare_weights,
)
from qinsight.core.advice import Advice as Advice, advice_of as advice_of
from qinsight.core.comparison import (
    ActivationComparison as ActivationComparison,
    Comparison as Comparison,
    ConfigComparison as ConfigComparison,
    LoweredComparison as LoweredComparison,
    WeightComparison as WeightComparison,
)
from qinsight.core.equalization import EqualizationMapping as EqualizationMapping
from qinsight.core.errors import QinsightError as QinsightError
from qinsight.core.formats import FormatPlan as FormatPlan
from qinsight.core.plan import QuantPlan as QuantPlan
from qinsight.core.report import Report as Report
from qinsight.core.smoothing import SmoothingMapping as SmoothingMapping
from qinsight.distributed import shard as shard
from qinsight.outputs.diff import ReportDiff as ReportDiff, diff_reports as diff_reports
from qinsight.outputs.serde import load_report as load_report, save_report as save_report
from qinsight.outputs.text import to_text as to_text
from qinsight.pipeline import (
    comparison_report as comparison_report,
    diagnose as diagnose,
    instrument as instrument,
    merge_reports as merge_reports,
    verify_report as verify_report,
)
from qinsight.planning import plan as plan, plan_formats as plan_formats
