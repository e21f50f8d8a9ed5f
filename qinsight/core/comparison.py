"""Typed results of comparing a float model with its quantized version (torch-free)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs

from qinsight.core.errors import NotFoundError

T = TypeVar("T")


def _find(items: Sequence[T], key: Callable[[T], str], wanted: str, what: str) -> T:
    """The item whose ``key`` is ``wanted``; a :class:`NotFoundError` naming the others if none is."""
    for item in items:
        if key(item) == wanted:
            return item
    raise NotFoundError(what, wanted, (key(i) for i in items))


def _legacy_direction(value: MetricValue) -> bool:
    # Files before schema 1.3 did not record a metric's direction: then SQNR and cosine were
    # the metrics where higher is better, and every other metric, plugins' included, an error.
    return value.name in ("sqnr", "cosine")


@attrs.frozen(kw_only=True)
class MetricValue:
    """A metric's value, with the direction its metric declared (:class:`qinsight.plugin.Metric`)."""

    name: str
    value: float
    higher_is_better: bool = attrs.field(default=attrs.Factory(_legacy_direction, takes_self=True))

    @property
    def goodness(self) -> float:
        """The value signed so that larger is always better: what worst-first orders sort by."""
        return self.value if self.higher_is_better else -self.value


def _value(metrics: Sequence[MetricValue], name: str) -> MetricValue:
    return _find(metrics, lambda m: m.name, name, "metric")


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
    matches a quantized conv that absorbed it. ``quantized`` is False where the
    quantized model left the layer in float.
    """

    fqn: str
    kind: str
    quantized_type: str
    quantized: bool
    folded_bn: str | None
    metrics: tuple[MetricValue, ...]
    per_channel: tuple[ChannelMetric, ...]

    def metric(self, name: str) -> float:
        return self.metric_value(name).value

    def metric_value(self, name: str) -> MetricValue:
        return _value(self.metrics, name)


@attrs.frozen(kw_only=True)
class WeightComparison:
    layers: tuple[LayerWeightComparison, ...]

    def layer(self, fqn: str) -> LayerWeightComparison:
        return _find(self.layers, lambda layer: layer.fqn, fqn, "layer")

    def worst(self, metric: str = "sqnr", count: int | None = 5) -> tuple[LayerWeightComparison, ...]:
        """The ``count`` layers where ``metric`` is worst (lowest SQNR, highest error), worst first."""
        return tuple(sorted(self.layers, key=lambda layer: layer.metric_value(metric).goodness)[:count])


@attrs.frozen(kw_only=True)
class LayerActivationComparison:
    """The output of ``fqn`` in the float model against the quantized model's.

    ``batches`` counts the outputs compared: one per batch, or one per call for a
    module called several times per forward (each call against the same call).

    ``propagated``: float model vs quantized model, error accumulated from the
    input (torch's ``add_loggers``). ``local``: the quantized layer fed the
    float layer's input (torch's shadow loggers), the error this layer makes.
    The float output is taken at ``compared_at``, the end of the fused group
    (``relu1`` for conv1 → bn1 → relu1), where the quantized module's output is.
    ``quantized`` is False where the quantized model left the layer in float.
    """

    fqn: str
    kind: str
    quantized_type: str
    quantized: bool
    compared_at: str
    batches: int = attrs.field(validator=attrs.validators.ge(0))
    propagated: tuple[MetricValue, ...]
    local: tuple[MetricValue, ...]

    def metric(self, name: str, *, local: bool = False) -> float:
        return self.metric_value(name, local=local).value

    def metric_value(self, name: str, *, local: bool = False) -> MetricValue:
        return _value(self.local if local else self.propagated, name)

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
    """Rows for the Linear/Conv ``layers`` and for the ``ops`` around them (adds, matmuls, softmax,
    norms..., named as the report's op sites: ``attn.add#0`` or a module's name)."""

    layers: tuple[LayerActivationComparison, ...]
    ops: tuple[LayerActivationComparison, ...] = ()

    @property
    def rows(self) -> tuple[LayerActivationComparison, ...]:
        return self.layers + self.ops

    def layer(self, fqn: str) -> LayerActivationComparison:
        """The row of layer or op ``fqn``."""
        return _find(self.rows, lambda layer: layer.fqn, fqn, "layer or op")

    def worst(
        self, metric: str = "sqnr", *, local: bool = True, count: int | None = 5, ops: bool = True
    ) -> tuple[LayerActivationComparison, ...]:
        """The ``count`` rows where ``metric`` is worst, worst first: by default where the most error
        is made (local), among the layers and the ops (``ops=False``: the layers only)."""
        rows = self.rows if ops else self.layers
        return tuple(sorted(rows, key=lambda layer: layer.metric_value(metric, local=local).goodness)[:count])


@attrs.frozen(kw_only=True)
class ConfigScore:
    """One layer under one candidate config."""

    config: str
    quantized_type: str
    propagated: tuple[MetricValue, ...]
    local: tuple[MetricValue, ...]

    def metric(self, name: str, *, local: bool = True) -> float:
        return self.metric_value(name, local=local).value

    def metric_value(self, name: str, *, local: bool = True) -> MetricValue:
        return _value(self.local if local else self.propagated, name)


@attrs.frozen(kw_only=True)
class LayerConfigRow:
    """A layer's scores under every config, and the config with the best local ``rank_by``."""

    fqn: str
    kind: str
    scores: tuple[ConfigScore, ...]
    best: str

    def score(self, config: str) -> ConfigScore:
        return _find(self.scores, lambda score: score.config, config, "config")


@attrs.frozen(kw_only=True)
class ConfigComparison:
    """Several candidate configs of one float model, layer by layer (torch's n-shadows job).

    ``best`` per row ranks configs by the *local* ``rank_by`` metric: the error
    the layer itself makes under that config, free of what earlier layers did.
    A layer a config leaves in float has no row entry for that config.
    """

    configs: tuple[str, ...]
    rank_by: str
    rows: tuple[LayerConfigRow, ...]

    def row(self, fqn: str) -> LayerConfigRow:
        return _find(self.rows, lambda row: row.fqn, fqn, "layer")

    def best(self) -> dict[str, str]:
        """Layer name -> the config that quantizes it best."""
        return {row.fqn: row.best for row in self.rows}


def best_config(scores: tuple[ConfigScore, ...], rank_by: str) -> str:
    """The config of the best score by local ``rank_by`` (the first one on ties), in the metric's direction."""
    return max(scores, key=lambda s: s.metric_value(rank_by).goodness).config


@attrs.frozen(kw_only=True)
class ProgramCost:
    """What running a lowered program costs: the median wall time of one batch (every batch of the
    data timed once, after a first call that is not) and the program's size in bytes (an ExecuTorch
    program: its ``.pte``; a compiled module: the constants its graph computes with)."""

    latency_ms: float
    size_bytes: int = attrs.field(validator=attrs.validators.ge(0))


@attrs.frozen(kw_only=True)
class LayerParity:
    """One quantized layer or op of the reference model lowered alone, against the reference's same
    stretch of graph (input quantize, layer or op, activation, output quantize) on the inputs the
    reference gave it.

    ``sqnr`` (dB) is the lowered kernel's output against the reference's (local: what this kernel
    does otherwise); ``propagated`` (dB) the layer's output in the reference with every layer's
    kernel lowered, against the reference's (where differences add up); ``max_abs`` the local largest
    difference; ``step`` the output's quantization step (``None``: the output stays in float), so that
    ``max_abs / step`` says how many steps the lowered kernel rounds apart. ``mismatched`` is the
    fraction of output values that differ at all.
    """

    fqn: str
    kind: str
    sqnr: float
    propagated: float
    max_abs: float
    step: float | None
    mismatched: float
    batches: int = attrs.field(validator=attrs.validators.ge(0))

    @property
    def max_steps(self) -> float | None:
        """The largest difference in output quantization steps (``None`` for a float output)."""
        return None if self.step is None or self.step <= 0.0 else self.max_abs / self.step


@attrs.frozen(kw_only=True)
class LoweredComparison:
    """A quantized model's reference (``convert_pt2e``'s output) against the program lowered from it for
    a backend, on the same batches: what the device runs, not the simulation of it.

    The three ``*_vs_*`` fields are output metrics over every batch (the first side is the reference
    of the pair: ``lowered_vs_reference`` scores the lowered program's outputs against the reference
    model's). ``layers`` says which layer's (or op's) lowered kernel departs from its reference, worst
    first; ``unlowered`` names those that could not be lowered alone, each with why; ``program`` and
    ``float_program`` what the int8 program and the float model lowered the same way
    cost (``None`` where the float program was not measured).
    """

    backend: str
    runtime: str
    batches: int = attrs.field(validator=attrs.validators.ge(0))
    lowered_vs_reference: tuple[MetricValue, ...]
    lowered_vs_float: tuple[MetricValue, ...]
    reference_vs_float: tuple[MetricValue, ...]
    layers: tuple[LayerParity, ...] = ()
    unlowered: tuple[str, ...] = ()
    program: ProgramCost
    float_program: ProgramCost | None = None

    def metric(self, pair: str, name: str = "sqnr") -> float:
        """``name`` for ``pair``: ``"lowered_vs_reference"``, ``"lowered_vs_float"`` or ``"reference_vs_float"``."""
        pairs = {
            "lowered_vs_reference": self.lowered_vs_reference,
            "lowered_vs_float": self.lowered_vs_float,
            "reference_vs_float": self.reference_vs_float,
        }
        if pair not in pairs:
            raise NotFoundError("output pair", pair, pairs)
        return _value(pairs[pair], name).value

    def layer(self, fqn: str) -> LayerParity:
        return _find(self.layers, lambda layer: layer.fqn, fqn, "layer")

    def worst(self, count: int | None = 5) -> tuple[LayerParity, ...]:
        """The ``count`` layers whose lowered kernel departs most from the reference (lowest SQNR), worst first."""
        return tuple(sorted(self.layers, key=lambda layer: layer.sqnr)[:count])

    @property
    def speedup(self) -> float | None:
        """The float program's latency over the int8 program's (above 1: the int8 program is faster)."""
        if self.float_program is None or self.program.latency_ms <= 0.0:
            return None
        return self.float_program.latency_ms / self.program.latency_ms

    @property
    def size_ratio(self) -> float | None:
        """The int8 program's size over the float program's."""
        if self.float_program is None or self.float_program.size_bytes == 0:
            return None
        return self.program.size_bytes / self.float_program.size_bytes


@attrs.frozen(kw_only=True)
class Comparison:
    """What was measured of a float model against its quantized version(s): what a report file carries.

    ``quantized`` says what the quantized side was (``"convert_fx"``,
    ``"convert_pt2e"``, the candidate configs' names…), for whoever reads the
    file later; ``lowered`` what the program lowered from it for a backend computes and costs.
    """

    quantized: str = ""
    weights: WeightComparison | None = None
    activations: ActivationComparison | None = None
    configs: ConfigComparison | None = None
    lowered: LoweredComparison | None = None
