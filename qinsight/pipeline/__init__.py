"""The pipeline: a model and its data in, a Report out (``session``), the analysis every report goes
through (``analysis``), reports of disjoint data merged into one (``merge``), and the report's config verified for real
(``verifier``), and candidate configs quantized for real and compared layer by layer
(``config_comparison``)."""

from qinsight.pipeline.analysis import comparison_report, default_detectors
from qinsight.pipeline.config_comparison import compare_configs, quantize_candidates
from qinsight.pipeline.merge import merge_reports
from qinsight.pipeline.session import Session, diagnose, instrument
from qinsight.pipeline.verifier import verify_report

__all__ = [
    "Session",
    "compare_configs",
    "comparison_report",
    "default_detectors",
    "diagnose",
    "instrument",
    "merge_reports",
    "quantize_candidates",
    "verify_report",
]
