"""resolution.activations: input channels that a per-tensor activation scale leaves with few bits."""

from __future__ import annotations

import math
from typing import ClassVar

import attrs

from qinsight.plugin import (
    API_VERSION,
    DetectorResult,
    Finding,
    InsertPoint,
    ModelView,
    ObservedStats,
    OpKind,
    QuantSuggestion,
    Side,
    result_of,
)

__all__ = ["ActivationResolutionDetector", "ActivationResolutionFinding"]


@attrs.frozen(kw_only=True)
class ActivationResolutionFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = ("no live channels", "channels starved per-tensor", "resolution fine")

    kind: OpKind
    live_channels: int
    starved_channels: tuple[int, ...]
    widest_channel: int
    median_bits: float
    min_bits: float
    starved_share: float

    @property
    def equalize(self) -> bool:
        return self.live_channels > 0 and len(self.starved_channels) >= self.starved_share * self.live_channels

    @property
    def verdict(self) -> str:
        if self.live_channels == 0:
            return "no live channels"
        return "channels starved per-tensor" if self.equalize else "resolution fine"

    @property
    def actionable(self) -> bool:
        return self.equalize

    def reason(self) -> str:
        return (
            f"{len(self.starved_channels)}/{self.live_channels} input channels under {self.min_bits:g} bits "
            f"per-tensor (median {self.median_bits:.1f} bits; widest channel {self.widest_channel})"
        )


def _bits(channel_range: float, tensor_range: float) -> float:
    return math.log2(255 * channel_range / tensor_range)


@attrs.frozen(kw_only=True)
class ActivationResolutionDetector:
    """Per-channel input ranges against the tensor's range, from the host's observers."""

    id: ClassVar[str] = "resolution.activations"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = ActivationResolutionFinding

    min_bits: float = attrs.field(
        default=4.0, validator=attrs.validators.and_(attrs.validators.gt(0.0), attrs.validators.le(8.0))
    )
    starved_share: float = attrs.field(
        default=0.25, validator=attrs.validators.and_(attrs.validators.gt(0.0), attrs.validators.le(1.0))
    )

    def insert_points(self, view: ModelView) -> tuple[InsertPoint, ...]:
        return tuple(InsertPoint.at(site, Side.PRE, per_channel=True) for site in view.sites)

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        findings = []
        for site, point in zip(view.sites, self.insert_points(view)):
            observed = stats.for_point(point)
            if observed is None or observed.channel_min is None or observed.channel_max is None:
                continue  # never ran: nothing to say
            ranges = [hi - lo for lo, hi in zip(observed.channel_min, observed.channel_max)]
            total = observed.epoch_range
            live = [(c, r) for c, r in enumerate(ranges) if r > 0 and total > 0]
            bits = sorted(_bits(r, total) for _, r in live)
            findings.append(
                ActivationResolutionFinding(
                    fqn=site.fqn,
                    kind=site.kind,
                    live_channels=len(live),
                    starved_channels=tuple(c for c, r in live if _bits(r, total) < self.min_bits),
                    widest_channel=max(range(len(ranges)), key=ranges.__getitem__) if ranges else -1,
                    median_bits=bits[len(bits) // 2] if bits else 0.0,
                    min_bits=self.min_bits,
                    starved_share=self.starved_share,
                )
            )
        suggestions = [
            QuantSuggestion(fqn=f.fqn, equalize=f.equalize, sources=(self.id,)) for f in findings if f.live_channels
        ]
        return result_of(self, findings, suggestions)
