"""The pipeline: a model and its data in, a Report out (``session``), the analysis every report goes
through (``analysis``), and reports of disjoint data merged into one (``merge``)."""

from qinsight.pipeline.analysis import comparison_report, default_detectors
from qinsight.pipeline.merge import merge_reports
from qinsight.pipeline.session import Session, diagnose, instrument

__all__ = ["Session", "comparison_report", "default_detectors", "diagnose", "instrument", "merge_reports"]
