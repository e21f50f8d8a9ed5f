"""Source text of detector plugins that tests install as fake distributions."""

WIDTHS = """
from typing import ClassVar
import attrs
from qinsight.types import Finding
from qinsight.plugin.detector import result_of

@attrs.frozen(kw_only=True)
class WidthFinding(Finding):
    width: int

    @property
    def verdict(self) -> str:
        return "wide" if self.width > 16 else "narrow"

    @property
    def actionable(self) -> bool:
        return self.width > 16

    def reason(self) -> str:
        return f"{self.width} input features"

class WidthDetector:
    id = "acme.widths"
    api_version = 1
    finding_type = WidthFinding

    def insert_points(self, view):
        return ()

    def analyze(self, view, stats):
        return result_of(self, [WidthFinding(fqn=s.fqn, width=view.weight(s.fqn).shape[1]) for s in view.sites], ())
"""
