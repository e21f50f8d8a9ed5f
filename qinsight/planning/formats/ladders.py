"""The layers a mixed-format plan assigns, each with its ladder of formats (most bits first), and the
order in which the search steps them down: cheapest damage per bit saved first.

Every layer starts on its ladder's top rung. A *move* takes one layer down to a lower rung; its price is
the damage it adds over the bits it saves (each layer's damage measured alone, which adds up over
layers whose errors are independent). A layer's own moves must come in ladder order, so where a
lower rung is cheaper per bit than the one above it, the two moves are pooled into one (the layer
skips the rung). Sorting every layer's moves by price gives one order; the first ``k`` moves are the
plan of size ``k``. Any damage measure gives an order: the measured one (end to end), the Fisher
proxy, the activation-weighted weight error (:mod:`.proxies`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
from torch import nn

from qinsight.core.formats import LayerFormat, WeightFormat
from qinsight.core.notes import Note, NoteKind


@attrs.frozen(kw_only=True)
class Rungs:
    """One Linear the plan assigns: its formats, most bits per weight first (ties: the order given)."""

    fqn: str
    parameters: int
    in_features: int
    formats: tuple[WeightFormat, ...]
    float_bits: int

    def bits(self, fmt: WeightFormat) -> float:
        return fmt.bits(self.in_features, self.float_bits)


@attrs.frozen(kw_only=True)
class Move:
    """``fqn`` down to ``to``, at ``price`` damage per bit saved."""

    fqn: str
    to: WeightFormat
    price: float


def ladders(model: nn.Module, formats: Sequence[WeightFormat]) -> tuple[tuple[Rungs, ...], tuple[Note, ...]]:
    """Every Linear of ``model`` with the formats it can take, and notes on those left out: a weight shared
    with another module (a tied output head: quantizing it would untie it) or one no format fits."""
    owners: dict[int, list[str]] = {}
    for fqn, module in model.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            owners.setdefault(id(parameter), []).append(f"{fqn}.{name}" if fqn else name)
    found, tied, unfit = [], [], []
    for fqn, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if len(owners[id(module.weight)]) > 1:
            tied.append(fqn)
            continue
        fitting = tuple(f for f in formats if f.fits(module.in_features))
        if not fitting:
            unfit.append(fqn)
            continue
        bits = module.weight.element_size() * 8
        ordered = sorted(fitting, key=lambda f: -f.bits(module.in_features, bits))
        found.append(
            Rungs(
                fqn=fqn,
                parameters=module.weight.numel(),
                in_features=module.in_features,
                formats=tuple(ordered),
                float_bits=bits,
            )
        )
    notes = []
    if tied:
        said = f"left float, their weights shared with another module (quantizing would untie them): {', '.join(tied)}"
        notes.append(Note(NoteKind.TIED_WEIGHTS, said))
    if unfit:
        notes.append(
            Note(NoteKind.NO_FORMAT_FITS, f"left float, no format's groups divide their inputs: {', '.join(unfit)}")
        )
    return tuple(found), tuple(notes)


def ordered_moves(layers: Sequence[Rungs], damage: Mapping[tuple[str, str], float]) -> tuple[Move, ...]:
    """Every layer's moves down its ladder, cheapest damage per bit saved first (``damage`` of each
    layer in each format; ``float`` costs none)."""
    moves: list[tuple[float, int, Move]] = []
    for index, layer in enumerate(layers):
        for move in _pooled(layer, damage):
            moves.append((move.price, index, move))
    moves.sort(key=lambda entry: (entry[0], entry[1]))
    return tuple(move for _, _, move in moves)


def _pooled(layer: Rungs, damage: Mapping[tuple[str, str], float]) -> list[Move]:
    """The layer's moves in ladder order with prices that never fall (a cheaper rung below a dearer one
    is taken in one move with it)."""

    def cost(fmt: WeightFormat) -> float:
        return 0.0 if fmt.is_float else damage[(layer.fqn, fmt.name)]

    pooled: list[tuple[WeightFormat, WeightFormat, float]] = []  # (from, to, price)
    for upper, lower in zip(layer.formats, layer.formats[1:]):
        start = upper
        while True:
            saved = (layer.bits(start) - layer.bits(lower)) * layer.parameters
            price = (cost(lower) - cost(start)) / saved if saved > 0 else float("inf")
            if not pooled or pooled[-1][2] <= price:
                break
            start = pooled.pop()[0]
        pooled.append((start, lower, price))
    return [Move(fqn=layer.fqn, to=to, price=max(price, 0.0)) for _, to, price in pooled]


def assignment(layers: Sequence[Rungs], moves: Sequence[Move], taken: int) -> dict[str, str]:
    """Each layer's format after the first ``taken`` moves."""
    formats = {layer.fqn: layer.formats[0].name for layer in layers}
    for move in moves[:taken]:
        formats[move.fqn] = move.to.name
    return formats


def layer_formats(layers: Sequence[Rungs], formats: Mapping[str, str]) -> tuple[LayerFormat, ...]:
    return tuple(
        LayerFormat(
            fqn=layer.fqn,
            format=formats[layer.fqn],
            parameters=layer.parameters,
            bits=layer.bits(WeightFormat(formats[layer.fqn])),
        )
        for layer in layers
    )


def within(layers: Sequence[Rungs], moves: Sequence[Move], bits: float) -> int:
    """The fewest moves after which the mean bits per weight are at most ``bits`` (all of them if never)."""
    total = sum(layer.parameters for layer in layers)
    by_fqn = {layer.fqn: layer for layer in layers}
    current = {layer.fqn: layer.bits(layer.formats[0]) for layer in layers}
    spent = sum(current[layer.fqn] * layer.parameters for layer in layers)
    for taken, move in enumerate(moves):
        if spent <= bits * total:
            return taken
        layer = by_fqn[move.fqn]
        spent += (layer.bits(move.to) - current[move.fqn]) * layer.parameters
        current[move.fqn] = layer.bits(move.to)
    return len(moves)


def uniform(layers: Sequence[Rungs], fmt: WeightFormat) -> dict[str, str]:
    """``fmt`` for every layer it fits (the others on their top rung)."""
    return {layer.fqn: fmt.name if fmt in layer.formats else layer.formats[0].name for layer in layers}


__all__ = ["Move", "Rungs", "assignment", "layer_formats", "ladders", "ordered_moves", "uniform", "within"]
