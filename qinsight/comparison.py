"""Typed results of comparing a float model with its quantized version (torch-free)."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class MetricValue:
    name: str
    value: float


@attrs.frozen(kw_only=True)
class ChannelMetric:
    """One metric per output channel."""

    name: str
    values: tuple[float, ...]


@attrs.frozen(kw_only=True)
class LayerWeightComparison:
    """The float weight of ``fqn`` against the quantized model's dequantized one.

    ``quantized_type`` is the quantized module's qualified class name (a
    dynamic Linear and a static one are both called ``Linear``); ``folded_bn``
    names the BatchNorm folded into the float weight first, so the comparison
    matches a quantized conv that absorbed it.
    """

    fqn: str
    kind: str
    quantized_type: str
    folded_bn: str | None
    metrics: tuple[MetricValue, ...]
    per_channel: tuple[ChannelMetric, ...]

    def metric(self, name: str) -> float:
        for metric in self.metrics:
            if metric.name == name:
                return metric.value
        raise KeyError(f"no metric {name!r} for {self.fqn}; metrics: {', '.join(m.name for m in self.metrics)}")


@attrs.frozen(kw_only=True)
class WeightComparison:
    layers: tuple[LayerWeightComparison, ...]

    def layer(self, fqn: str) -> LayerWeightComparison:
        for layer in self.layers:
            if layer.fqn == fqn:
                return layer
        raise KeyError(f"no layer {fqn!r}; layers: {', '.join(l.fqn for l in self.layers)}")

    def worst(self, metric: str = "sqnr", count: int = 5) -> tuple[LayerWeightComparison, ...]:
        """The layers with the lowest ``metric`` (for SQNR: the most error)."""
        return tuple(sorted(self.layers, key=lambda layer: layer.metric(metric))[:count])
