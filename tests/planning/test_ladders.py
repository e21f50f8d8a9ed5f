"""The mixed-format plan's order of moves (:mod:`qinsight.planning.formats.ladders`), as properties over any
measured damages: each layer steps down its ladder in order, the prices never fall, and a budget takes
the fewest moves that fit it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qinsight.core.formats import WeightFormat, mean_bits
from qinsight.planning.formats import ladders
from qinsight.planning.formats.ladders import Rungs

FORMATS = tuple(WeightFormat(name) for name in ("float", "int8", "int4_g64", "int4_g32"))


@st.composite
def measured(draw: st.DrawFn) -> tuple[tuple[Rungs, ...], dict[tuple[str, str], float]]:
    count = draw(st.integers(1, 6))
    layers, damage = [], {}
    for index in range(count):
        fqn = f"layers.{index}"
        inputs = draw(st.sampled_from((64, 128, 576)))
        formats = tuple(sorted(FORMATS, key=lambda f: -f.bits(inputs, 32)))
        layers.append(
            Rungs(
                fqn=fqn,
                parameters=draw(st.integers(1, 10_000)) * inputs,
                in_features=inputs,
                formats=formats,
                float_bits=32,
            )
        )
        for fmt in formats:
            damage[(fqn, fmt.name)] = draw(st.floats(0.0, 10.0))
    return tuple(layers), damage


@given(measured())
def test_each_layer_steps_down_its_ladder_in_order_at_prices_that_never_fall(
    case: tuple[tuple[Rungs, ...], dict[tuple[str, str], float]],
) -> None:
    layers, damage = case
    moves = ladders.ordered_moves(layers, damage)
    assert [m.price for m in moves] == sorted(m.price for m in moves)
    for layer in layers:
        rungs = [m.to for m in moves if m.fqn == layer.fqn]
        positions = [layer.formats.index(f) for f in rungs]
        assert positions == sorted(set(positions)) and positions[-1] == len(layer.formats) - 1  # down, to the bottom


@given(measured(), st.floats(4.0, 40.0))
def test_a_budget_takes_the_fewest_moves_that_fit_it(
    case: tuple[tuple[Rungs, ...], dict[tuple[str, str], float]], bits: float
) -> None:
    layers, damage = case
    moves = ladders.ordered_moves(layers, damage)
    taken = ladders.within(layers, moves, bits)

    def bits_after(k: int) -> float:
        return mean_bits(ladders.layer_formats(layers, ladders.assignment(layers, moves, k)))

    assert taken == len(moves) or bits_after(taken) <= bits + 1e-9
    assert taken == 0 or bits_after(taken - 1) > bits - 1e-9
