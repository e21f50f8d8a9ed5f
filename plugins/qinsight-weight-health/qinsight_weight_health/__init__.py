"""health.weights: dead, exploding and per-tensor-starved weight channels."""

from __future__ import annotations

import math
from typing import ClassVar

import attrs
import torch

from qinsight.plugin import (
    API_VERSION,
    DetectorResult,
    Finding,
    ModelView,
    ObservedStats,
    OpKind,
    QuantSuggestion,
    WeightScheme,
    result_of,
)

__all__ = ["WeightHealthDetector", "WeightHealthFinding", "effective_bits"]


def effective_bits(channel_range: float, tensor_range: float, levels: int = 256) -> float:
    """Bits a channel keeps when one scale covers the whole tensor's range."""
    if channel_range <= 0.0 or tensor_range <= 0.0:
        return 0.0
    return math.log2((levels - 1) * channel_range / tensor_range)


@attrs.frozen(kw_only=True)
class WeightHealthFinding(Finding):
    verdicts: ClassVar[tuple[str, ...]] = ("unhealthy weights", "per-tensor weights starve channels", "healthy")

    kind: OpKind
    channels: int
    dead_channels: tuple[int, ...]
    exploding_channels: tuple[int, ...]
    starved_channels: tuple[int, ...]
    min_bits: float
    starved_share: float
    range_spread: float  # widest / median channel range

    @property
    def per_channel_needed(self) -> bool:
        return len(self.starved_channels) >= self.starved_share * self.channels

    @property
    def verdict(self) -> str:
        if self.dead_channels or self.exploding_channels:
            return "unhealthy weights"
        return "per-tensor weights starve channels" if self.per_channel_needed else "healthy"

    @property
    def actionable(self) -> bool:
        return self.verdict != "healthy"

    def reason(self) -> str:
        parts = [
            f"{len(self.starved_channels)}/{self.channels} channels under {self.min_bits:g} bits per-tensor "
            f"(widest/median range {self.range_spread:.1f})"
        ]
        if self.dead_channels:
            parts.append(f"{len(self.dead_channels)} dead")
        if self.exploding_channels:
            parts.append(f"{len(self.exploding_channels)} exploding")
        return "; ".join(parts)


@attrs.frozen(kw_only=True)
class WeightHealthDetector:
    """Reads weights only: per output channel, dead, exploding, and starved under per-tensor scales."""

    id: ClassVar[str] = "health.weights"
    api_version: ClassVar[int] = API_VERSION
    finding_type: ClassVar[type[Finding]] = WeightHealthFinding

    min_bits: float = attrs.field(
        default=4.0, validator=attrs.validators.and_(attrs.validators.gt(0.0), attrs.validators.le(8.0))
    )
    starved_share: float = attrs.field(
        default=0.1, validator=attrs.validators.and_(attrs.validators.gt(0.0), attrs.validators.le(1.0))
    )
    exploding_factor: float = attrs.field(default=100.0, validator=attrs.validators.gt(1.0))

    def insert_points(self, view: ModelView) -> tuple[()]:
        return ()

    def _finding(self, fqn: str, kind: OpKind, weight: torch.Tensor) -> WeightHealthFinding:
        rows = weight.detach().double().reshape(weight.shape[0], -1)  # one row per output channel
        ranges = (rows.amax(dim=1) - rows.amin(dim=1)).tolist()
        magnitudes = rows.abs().amax(dim=1)
        median = float(magnitudes.median())
        tensor_range = float(rows.max() - rows.min())
        live = sorted(r for r in ranges if r > 0) or [0.0]
        return WeightHealthFinding(
            fqn=fqn,
            kind=kind,
            channels=len(ranges),
            dead_channels=tuple(c for c, m in enumerate(magnitudes.tolist()) if m == 0.0),
            exploding_channels=tuple(
                c for c, m in enumerate(magnitudes.tolist()) if median > 0 and m > self.exploding_factor * median
            ),
            starved_channels=tuple(
                c for c, r in enumerate(ranges) if r > 0 and effective_bits(r, tensor_range) < self.min_bits
            ),
            min_bits=self.min_bits,
            starved_share=self.starved_share,
            range_spread=live[-1] / live[len(live) // 2] if live[len(live) // 2] > 0 else 0.0,
        )

    def analyze(self, view: ModelView, stats: ObservedStats) -> DetectorResult:
        findings = [self._finding(site.fqn, site.kind, view.weight(site.fqn)) for site in view.sites]
        suggestions = [
            QuantSuggestion(fqn=f.fqn, weight=WeightScheme.PER_CHANNEL, sources=(self.id,))
            for f in findings
            if f.per_channel_needed
        ]
        return result_of(self, findings, suggestions)
