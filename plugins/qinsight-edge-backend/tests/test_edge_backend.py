"""``edge``, a backend registered by this package alone, through what a user runs: diagnose (by name
and by quantizer), pt2e_quantizer, plan with lowered=True, compare_lowered and the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from qinsight_edge_backend import EDGE, default_quantizer, edge_quantizer_class

import qinsight
from qinsight.core.backend import backend_names, backend_of, get_backend
from qinsight.examples.builtin import example


@pytest.fixture(scope="module")
def cnn() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    chosen = example("cnn")
    return chosen.model(), chosen.data(12)


def test_the_entry_point_makes_edge_a_backend_served_by_pt2e_and_lowered() -> None:
    assert "edge" in backend_names() and get_backend("edge") is EDGE
    assert EDGE.flows == ("pt2e",) and EDGE.lowering is not None
    # found by what a quantizer is: EdgeQuantizer subclasses XNNPACKQuantizer, and the most derived class wins
    found = backend_of(default_quantizer())
    assert found is not None and found.name == "edge"
    xnnpack = backend_of(qinsight.backends.xnnpack.default_xnnpack_quantizer())
    assert xnnpack is not None and xnnpack.name == "xnnpack"


def test_diagnose_by_name_or_by_quantizer_gives_an_edge_report_verified_as_an_edge_quantizer(
    cnn: tuple[torch.nn.Module, list[torch.Tensor]],
) -> None:
    model, batches = cnn
    report = qinsight.diagnose(model, batches[:4], deploy="edge")
    assert report.metadata.backend == "edge"
    verification = report.verification_for("pt2e")
    # quantized for real in PT2E: EdgeQuantizer's default and the report's config, scored on held-out batches
    assert verification is not None and not verification.error and verification.default > 20.0
    assert verification.score > 20.0 and verification.held_out
    quantizer = qinsight.pt2e_quantizer(report)
    assert isinstance(quantizer.inner, edge_quantizer_class())  # the report's advice, as this backend's quantizer
    by_quantizer = qinsight.diagnose(model, batches[:4], deploy=default_quantizer(), verify=False)
    assert by_quantizer.metadata.backend == "edge"
    with pytest.raises(
        qinsight.errors.InvalidParameterError, match="for flow='fx' \\(edge is served by flow='pt2e'\\)"
    ):
        qinsight.qconfig_mapping(report)


@pytest.mark.slow
def test_a_lowered_edge_plan_scores_the_program_and_compare_lowered_measures_it(
    cnn: tuple[torch.nn.Module, list[torch.Tensor]],
) -> None:
    model, batches = cnn
    calibration, evaluation = batches[:6], batches[6:9]
    plan = qinsight.plan(
        model, calibration, evaluation, goal="sqnr>=35", deploy=qinsight.types.Deployment(backend="edge", lowered=True)
    )
    assert plan.flow == "pt2e" and plan.backend == "edge" and plan.reached
    assert plan.lowered.endswith("runtime, edge target")
    quantized = qinsight.quantize(model, plan, calibration)
    shipped = qinsight.compare_lowered(model, quantized, evaluation, backend="edge", layers=False, float_program=False)
    assert shipped.backend == "edge" and shipped.runtime.endswith("edge target")
    assert plan.verified_score == pytest.approx(shipped.metric("lowered_vs_float"), abs=1e-6)


@pytest.mark.slow
def test_the_command_line_takes_the_backend() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "qinsight", "diagnose", "--example", "cnn", "--backend", "edge", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "edge" in done.stdout and "pt2e" in done.stdout.lower()
