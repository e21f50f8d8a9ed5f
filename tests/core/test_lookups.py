"""Every lookup by name of qinsight's result types behaves alike: the thing, or one NotFoundError
(a QinsightError and a KeyError) that names what is there."""

from __future__ import annotations

import pytest
from _data import gaussian_batches
from _models import MLP, seeded

import qinsight


def test_every_lookup_finds_or_names_what_there_is() -> None:
    model = seeded(MLP())
    data = gaussian_batches((8, 16), 4)
    report = qinsight.diagnose(model, data[:2])
    quantized = qinsight.quantize(model, report, data[:2])
    plan = qinsight.plan(model, data[:2], data[2:], goal="sqnr>=20", report=report)
    activations = qinsight.compare_activations(model, quantized, data[2:])
    result = report.result("qinsight.per_channel")
    found = [
        report.result("qinsight.per_channel"),
        report.observation("fc1", qinsight.types.Side.PRE),
        result.finding("fc1"),
        plan.sensitivity(plan.sensitivities[0].fqn),
        activations.layer("fc1"),
    ]
    assert all(item is not None for item in found)
    missing = [
        lambda: report.result("acme.nothing"),
        lambda: report.suggestion("fc9"),
        lambda: report.observation("fc9", qinsight.types.Side.PRE),
        lambda: result.finding("fc9"),
        lambda: result.parameter("nothing"),
        lambda: plan.sensitivity("fc9"),
        lambda: activations.layer("fc9"),
        lambda: qinsight.examples.example("nothing"),
    ]
    for lookup in missing:
        with pytest.raises(qinsight.errors.NotFoundError, match=r"^no .*; there are: ") as caught:
            lookup()
        assert isinstance(caught.value, KeyError) and isinstance(caught.value, qinsight.QinsightError)
