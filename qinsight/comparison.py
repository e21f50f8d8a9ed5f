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


@attrs.frozen(kw_only=True)
class LayerActivationComparison:
    """The output of ``fqn`` in the float model against the quantized model's, over ``batches``.

    ``propagated``: float model vs quantized model, error accumulated from the
    input (torch's ``add_loggers``). ``local``: the quantized layer fed the
    float layer's input (torch's shadow loggers), the error this layer makes.
    The float output is taken at ``compared_at``, the end of the fused group
    (``relu1`` for conv1 → bn1 → relu1), where the quantized module's output is.
    """

    fqn: str
    kind: str
    quantized_type: str
    compared_at: str
    batches: int
    propagated: tuple[MetricValue, ...]
    local: tuple[MetricValue, ...]

    def metric(self, name: str, *, local: bool = False) -> float:
        for metric in self.local if local else self.propagated:
            if metric.name == name:
                return metric.value
        raise KeyError(f"no metric {name!r} for {self.fqn}")

    @property
    def error_ratio(self) -> float:
        """Propagated / local relative L2 error: above 1, error from earlier layers is amplified here."""
        local = self.metric("relative_l2", local=True)
        propagated = self.metric("relative_l2")
        if local == 0.0:
            return float("inf") if propagated > 0.0 else 1.0
        return propagated / local


@attrs.frozen(kw_only=True)
class ActivationComparison:
    layers: tuple[LayerActivationComparison, ...]

    def layer(self, fqn: str) -> LayerActivationComparison:
        for layer in self.layers:
            if layer.fqn == fqn:
                return layer
        raise KeyError(f"no layer {fqn!r}; layers: {', '.join(l.fqn for l in self.layers)}")

    def worst(self, metric: str = "sqnr", *, local: bool = True, count: int = 5) -> tuple[LayerActivationComparison, ...]:
        """The layers with the lowest ``metric``: by default where the most error is made (local)."""
        return tuple(sorted(self.layers, key=lambda layer: layer.metric(metric, local=local))[:count])
