# The one list of qinsight's top-level names: what type checkers see, and what qinsight/__init__.py
# reads at import to resolve each name lazily from the module written here (PEP 562). Records live
# in qinsight.types, errors in qinsight.errors, detectors in qinsight.detectors.

from qinsight._version import __version__ as __version__
from qinsight.apply import (
    bias_corrected as bias_corrected,
)
from qinsight.apply import (
    config_code as config_code,
)
from qinsight.apply import (
    equalization_config as equalization_config,
)
from qinsight.apply import (
    fqn_to_config as fqn_to_config,
)
from qinsight.apply import (
    pt2e_quantizer as pt2e_quantizer,
)
from qinsight.apply import (
    qconfig_mapping as qconfig_mapping,
)
from qinsight.apply import (
    quantize as quantize,
)
from qinsight.apply import (
    smoothed as smoothed,
)
from qinsight.compare import (
    compare_activations as compare_activations,
)
from qinsight.compare import (
    compare_lowered as compare_lowered,
)
from qinsight.compare import (
    compare_weights as compare_weights,
)
from qinsight.core.advice import Advice as Advice
from qinsight.core.advice import advice_of as advice_of
from qinsight.core.bias import BiasCorrection as BiasCorrection
from qinsight.core.comparison import (
    ActivationComparison as ActivationComparison,
)
from qinsight.core.comparison import (
    Comparison as Comparison,
)
from qinsight.core.comparison import (
    ConfigComparison as ConfigComparison,
)
from qinsight.core.comparison import (
    LoweredComparison as LoweredComparison,
)
from qinsight.core.comparison import (
    WeightComparison as WeightComparison,
)
from qinsight.core.equalization import EqualizationMapping as EqualizationMapping
from qinsight.core.errors import QinsightError as QinsightError
from qinsight.core.formats import FormatPlan as FormatPlan
from qinsight.core.plan import QuantPlan as QuantPlan
from qinsight.core.report import Report as Report
from qinsight.core.smoothing import SmoothingMapping as SmoothingMapping
from qinsight.distributed import shard as shard
from qinsight.outputs.diff import ReportDiff as ReportDiff
from qinsight.outputs.diff import diff_reports as diff_reports
from qinsight.outputs.serde import load_report as load_report
from qinsight.outputs.serde import save_report as save_report
from qinsight.outputs.text import to_text as to_text
from qinsight.pipeline import (
    compare_configs as compare_configs,
)
from qinsight.pipeline import (
    comparison_report as comparison_report,
)
from qinsight.pipeline import (
    diagnose as diagnose,
)
from qinsight.pipeline import (
    instrument as instrument,
)
from qinsight.pipeline import (
    merge_reports as merge_reports,
)
from qinsight.pipeline import (
    verify_report as verify_report,
)
from qinsight.planning import plan as plan
from qinsight.planning import plan_formats as plan_formats
