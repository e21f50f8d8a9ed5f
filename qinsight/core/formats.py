"""A mixed-format plan: which torchao ``quantize_`` format each Linear gets so that the model reaches a
quality target under a size budget, every number measured by quantizing for real.

The plan is built by :func:`qinsight.plan_formats` (``qinsight/planning/formats/``); here are its
immutable results, torch-free:

- :class:`WeightFormat`: a format by name (``int8``, ``int8_dynamic``, ``int4_g32``, ``float8``...),
  and the bits a weight costs in it, scales included;
- :class:`LayerFormat`: one Linear's format in the plan;
- :class:`FormatCost`: the damage one Linear does to the output in one format, the others float;
- :class:`CurvePoint`: an assignment quantized for real: its mean bits, bytes and scores;
- :class:`OrderCheck`: the same bits spent by another ranking of the layers (the Fisher proxy, the
  activation-weighted weight error), scored for real;
- :class:`FormatPlan`: all of it.
"""

from __future__ import annotations

import math
import re

import attrs

from qinsight.core.errors import InvalidParameterError, NotFoundError
from qinsight.core.notes import Note
from qinsight.core.plan import Budget, Target

_FORMAT = re.compile(r"^(float|int8|int8_dynamic|float8|int4_g(\d+)|int4_dynamic_g(\d+))$")
SCALE_BITS, ZERO_BITS = 32, 8  # torchao stores a float32 scale per row or group, and an int8 zero point for integers
FORMAT_NAMES = "float, int8, int8_dynamic, float8, int4_gN, int4_dynamic_gN (N: the group size, e.g. int4_g32)"


@attrs.frozen
class WeightFormat:
    """A ``quantize_`` format for a Linear's weight, by name.

    ``int8``: int8 weights, a scale per row, weight-only; ``int8_dynamic``: the same weights, the input
    quantized to int8 per token at run time; ``float8``: float8 (e4m3) weights, a scale per row;
    ``int4_gN``: int4 weights, a scale per group of N inputs; ``int4_dynamic_gN``: those with int8
    inputs per token; ``float``: the layer left as it is.
    """

    name: str

    @classmethod
    def parse(cls, text: str) -> WeightFormat:
        match = _FORMAT.match(text.strip()) if isinstance(text, str) else None
        if match is None or any(g is not None and int(g) < 1 for g in match.groups()[1:]):
            raise InvalidParameterError("plan_formats", "formats", text, f"format names among {FORMAT_NAMES}")
        return cls(text.strip())

    @property
    def is_float(self) -> bool:
        return self.name == "float"

    @property
    def value_bits(self) -> int:
        """Bits of one weight value (0 for ``float``: the model's own dtype)."""
        return 0 if self.is_float else 4 if self.name.startswith("int4") else 8

    @property
    def group(self) -> int:
        """Inputs sharing one scale; 0: a whole row."""
        return int(self.name.rsplit("_g", 1)[1]) if "_g" in self.name else 0

    @property
    def dynamic(self) -> bool:
        """Whether the layer's input is quantized too (per token, at run time)."""
        return "dynamic" in self.name

    def fits(self, in_features: int) -> bool:
        """Whether torchao can give a Linear of ``in_features`` inputs this format (groups must divide it)."""
        return self.group == 0 or in_features % self.group == 0

    def bits(self, in_features: int, float_bits: int) -> float:
        """What one weight costs stored in this format: its value and its share of the scales (and zero
        points) of its row or group; ``float_bits`` for ``float``."""
        if self.is_float:
            return float(float_bits)
        overhead = SCALE_BITS + (0 if self.name == "float8" else ZERO_BITS)
        return self.value_bits + overhead / (self.group or in_features)

    def __str__(self) -> str:
        return self.name


@attrs.frozen(kw_only=True)
class LayerFormat:
    """One Linear's format: ``parameters`` weights at ``bits`` each."""

    fqn: str
    format: str
    parameters: int = attrs.field(validator=attrs.validators.ge(0))
    bits: float


@attrs.frozen(kw_only=True)
class FormatCost:
    """One Linear alone in ``format`` (every other layer float), measured on the search data's ranking part:
    ``damage`` is what the search adds up (mean KL of the next-token distributions for language-model
    metrics, else the output error's power over the output's), ``score`` the plan's metric."""

    fqn: str
    format: str
    damage: float
    score: float


@attrs.frozen(kw_only=True)
class CurvePoint:
    """An assignment quantized for real with ``quantize_``: ``label`` says which (``uniform int8``,
    ``plan``, ``12 of 30 moves``), ``mean_bits`` per planned weight, ``state_bytes`` the planned Linears'
    weights as stored, ``score`` on the search data and ``held_out`` on the held-out data (NaN: none);
    ``bound`` the pessimistic end of the search score's confidence interval, what the search holds to
    the target (NaN: not a language-model metric, or no confidence asked; absent before 2.3)."""

    label: str
    mean_bits: float
    state_bytes: int = attrs.field(validator=attrs.validators.ge(0))
    score: float
    held_out: float = math.nan
    bound: float = math.nan


@attrs.frozen(kw_only=True)
class OrderCheck:
    """A ranking of the layers (``order``: ``measured`` end to end, or a proxy's), quantized for real:
    ``point`` at the plan's bits, on the search and held-out data; ``searched``, the size its own search
    chose, on the search data (the plan is the best of these; absent before 2.2)."""

    order: str
    point: CurvePoint
    searched: CurvePoint | None = None


@attrs.frozen(kw_only=True)
class FormatPlan:
    """The format of every planned Linear, so that ``quantize_`` with :func:`qinsight.fqn_to_config`
    of it reaches ``target`` (where given) within ``budget`` (where given).

    ``chosen`` is the plan quantized for real; ``reached`` holds only where the budget holds and the
    target is met as the search holds it (:attr:`target_held`): on the search data, at its confidence
    bound where there is one, and on the held-out data (``held_out`` NaN where there was none).
    ``uniform`` are the formats each given to every layer, ``curve`` the plan's ranking at several
    sizes, ``orders`` the plan's size spent by the other rankings; all quantized for real.
    """

    formats: tuple[str, ...]
    metric: str
    target: Target | None
    budget: Budget | None
    reached: bool
    layers: tuple[LayerFormat, ...]
    chosen: CurvePoint
    float_score: float
    uniform: tuple[CurvePoint, ...] = ()
    curve: tuple[CurvePoint, ...] = ()
    costs: tuple[FormatCost, ...] = ()
    orders: tuple[OrderCheck, ...] = ()
    evaluations: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    notes: tuple[Note, ...] = ()
    # the ranking the plan's moves follow: the one that scored best on the search data (absent before 2.2)
    order: str = "measured (end to end)"
    # the one-sided confidence of the points' ``bound`` the search holds to the target (absent before 2.3: none)
    confidence: float | None = None

    @property
    def mean_bits(self) -> float:
        return self.chosen.mean_bits

    @property
    def budget_held(self) -> bool:
        """The plan's bits within the budget (no budget: held)."""
        return self.budget is None or self.chosen.mean_bits <= self.budget.limit + 1e-9

    @property
    def target_by_score(self) -> bool:
        """The target met by the plan's scores, on the search data and the held-out data (no target: met)."""
        if self.target is None:
            return True
        held_out = math.isnan(self.chosen.held_out) or self.target.met(self.chosen.held_out)
        return self.target.met(self.chosen.score) and held_out

    @property
    def target_held(self) -> bool:
        """The target met as the search holds it: by the scores, and at the search score's confidence
        bound where the plan has one. A budget can force a plan past where the bound holds."""
        bound = self.chosen.bound
        return self.target_by_score and (self.target is None or math.isnan(bound) or self.target.met(bound))

    def format_of(self, fqn: str) -> str:
        for layer in self.layers:
            if layer.fqn == fqn:
                return layer.format
        raise NotFoundError("planned layer", fqn, (layer.fqn for layer in self.layers))

    def counts(self) -> dict[str, int]:
        """How many layers the plan gives each format."""
        found: dict[str, int] = {}
        for layer in self.layers:
            found[layer.format] = found.get(layer.format, 0) + 1
        return found


def mean_bits(layers: tuple[LayerFormat, ...] | list[LayerFormat]) -> float:
    """Bits per weight over ``layers``, each weighed by its parameters."""
    total = sum(layer.parameters for layer in layers)
    return sum(layer.bits * layer.parameters for layer in layers) / total if total else math.nan


__all__ = [
    "CurvePoint",
    "FORMAT_NAMES",
    "FormatCost",
    "FormatPlan",
    "LayerFormat",
    "OrderCheck",
    "WeightFormat",
    "mean_bits",
]
