"""Per-channel vs per-tensor weights (torch's PerChannelDetector).

Reads only the model's sites and their qconfigs: no observers. A site is
actionable when its backend supports per-channel weights for its kind and its
qconfig does not already use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Final

import attrs

from qinsight.core.findings import Finding
from qinsight.core.report import DetectorResult
from qinsight.core.sites import InsertPoint, OpKind, WeightScheme
from qinsight.core.stats import ObservedStats
from qinsight.core.suggestions import QuantSuggestion
from qinsight.detectors._validators import installed_backend
from qinsight.plugin.detector import API_VERSION, result_of

if TYPE_CHECKING:
    from qinsight.plugin.detector import ModelView

# Every backend qinsight knows supports per-channel weights for these kinds
# (and their QAT/fused variants, which the frontends map to the same kinds).
PER_CHANNEL_KINDS: Final[frozenset[OpKind]] = frozenset(kind for kind in OpKind if kind.is_layer)


@attrs.frozen(kw_only=True)
class PerChannelFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = ("per-channel unsupported", "per-channel in use", "per-channel recommended")

    kind: OpKind
    backend: str
    supported: bool
    used: bool
    # False when neither a qconfig on the module nor a qconfig mapping said how its weight
    # will be quantized: "used" is then not known to be false, only not known to be true.
    plan_known: bool = True

    @property
    def verdict(self) -> str:
        if not self.supported:
            return "per-channel unsupported"
        return "per-channel in use" if self.used else "per-channel recommended"

    @property
    def actionable(self) -> bool:
        return self.supported and not self.used

    def reason(self) -> str:
        if not self.supported:
            return f"{self.kind.value}: backend {self.backend} has no per-channel weights for it"
        if self.used:
            return f"{self.kind.value}: weights already quantized per channel"
        if not self.plan_known:
            return (
                f"{self.kind.value}: quantize its weights per channel; backend {self.backend} supports it "
                "(no qconfig mapping given, so how you plan to quantize them is unknown)"
            )
        return f"{self.kind.value}: weights not quantized per channel; backend {self.backend} supports it"


@attrs.frozen(kw_only=True)
class PerChannelDetector:
    """Finds Linear/Conv weights that could be quantized per channel on ``backend``."""

    id: ClassVar[str] = "qinsight.per_channel"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = PerChannelFinding

    backend: str = attrs.field(default="x86", validator=installed_backend())

    def insert_points(self, view: ModelView) -> tuple[InsertPoint, ...]:
        return ()

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        supported_kinds = PER_CHANNEL_KINDS
        findings = []
        suggestions = []
        for site in view.sites:
            supported = site.kind in supported_kinds
            findings.append(
                PerChannelFinding(
                    fqn=site.fqn,
                    kind=site.kind,
                    backend=self.backend,
                    supported=supported,
                    used=site.weight_scheme is WeightScheme.PER_CHANNEL,
                    plan_known=site.weight_scheme is not None,
                )
            )
            if supported:
                suggestions.append(QuantSuggestion(fqn=site.fqn, weight=WeightScheme.PER_CHANNEL, sources=(self.id,)))
        return result_of(self, findings, suggestions)
