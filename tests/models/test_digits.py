"""The digits CNN (scikit-learn's real handwritten digits): true-label accuracy before and after
quantization, and a model that reuses one nn.ReLU, as torchvision's ResNets do."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import nn
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qinsight

pytest.importorskip("sklearn")

from qinsight.examples.digits import Digits, digits_cnn  # noqa: E402

pytestmark = pytest.mark.slow  # real weights, or processes of their own: the whole suite's tier


@pytest.fixture(scope="module")
def digits() -> Digits:
    return digits_cnn()


def _batches(images: torch.Tensor, size: int) -> list[torch.Tensor]:
    return list(images.split(size))


def _accuracy_metric(labels: torch.Tensor) -> Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], float]:
    """The metric a user with labels passes: accuracy of the quantized model's argmax (evaluation order)."""

    def accuracy(_float: Sequence[torch.Tensor], quantized: Sequence[torch.Tensor]) -> float:
        return float((torch.cat([out.argmax(dim=1) for out in quantized]) == labels).double().mean())

    return accuracy


def test_the_cnn_learns_the_digits_and_a_rerun_gives_the_same_weights(digits: Digits) -> None:
    assert digits.accuracy(digits.model) >= 0.98  # 446 of the 450 held-out digits
    again = digits_cnn(epochs=2)
    twice = digits_cnn(epochs=2)
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), twice.model.state_dict().values()))
    assert torch.equal(again.test_labels, digits.test_labels)


def test_a_reused_relu_gets_one_partition_per_call_and_names_stay(digits: Digits) -> None:
    """torchao groups nodes by module: three calls of one nn.ReLU were one partition with three outputs."""
    from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

    exported = torch.export.export(digits.model, (digits.test_images[:8],)).module()
    assert len(get_source_partitions(exported.graph, [nn.ReLU])[nn.ReLU]) == 1
    before = {node.name: dict(node.meta.get("nn_module_stack") or {}) for node in exported.graph.nodes}
    qinsight.frontends.separate_shared_calls(exported)
    partitions = get_source_partitions(exported.graph, [nn.ReLU])[nn.ReLU]
    assert len(partitions) == 3 and all(len(p.output_nodes) == 1 for p in partitions)
    assert {node.name: dict(node.meta.get("nn_module_stack") or {}) for node in exported.graph.nodes} == before


def test_diagnosing_the_exported_model_asks_torchao_and_leaves_its_graph_as_it_was(digits: Digits) -> None:
    """The exported frontend asks X86InductorQuantizer which ops it quantizes: that raised on a reused
    ReLU; now it answers, and the partition marks it needed are taken off the user's graph again."""
    pytest.importorskip("torchao")
    batch = digits.train_images[:64]
    exported = torch.export.export(digits.model, (batch,)).module()
    report = qinsight.diagnose(exported, [batch])
    assert {site.fqn for site in report.sites if site.kind.is_layer} == {"conv1", "conv2", "conv3", "fc"}
    assert all("source_fn_stack" not in node.meta for node in exported.graph.nodes)


def test_the_report_quantizer_prepares_a_model_with_a_reused_relu(digits: Digits) -> None:
    """X86InductorQuantizer alone raises on this model (pytorch/ao#4478); the report's quantizer does not."""
    pytest.importorskip("torchao")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    calibration = _batches(digits.train_images[:512], 64)
    report = qinsight.diagnose(digits.model, calibration)
    exported = torch.export.export(digits.model, (calibration[0],)).module()
    plain = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    with pytest.raises(ValueError, match="more than one output node"):
        prepare_pt2e(torch.export.export(digits.model, (calibration[0],)).module(), plain)
    prepared = prepare_pt2e(exported, qinsight.pt2e_quantizer(report))
    for batch in calibration:
        prepared(batch)
    quantized = convert_pt2e(prepared)
    with torch.no_grad():
        predicted = torch.cat([quantized(batch).argmax(dim=1) for batch in _batches(digits.test_images[:448], 64)])
    assert float((predicted == digits.test_labels[:448]).double().mean()) >= 0.97


@pytest.mark.parametrize("flow", ["fx", "pt2e"])
def test_a_plan_keeps_the_fp32_accuracy_on_the_test_digits(digits: Digits, flow: str) -> None:
    """The target is the float model's own accuracy; the plan's config, applied as a user would, holds it."""
    if flow == "pt2e":
        pytest.importorskip("torchao")
    fp32 = digits.accuracy(digits.model)
    calibration = _batches(digits.train_images[:512], 64)
    evaluation = _batches(digits.test_images, 90)
    plan = qinsight.plan(
        digits.model,
        calibration,
        evaluation,
        goal=qinsight.types.Goal(target=f"accuracy>={fp32}", metric=_accuracy_metric(digits.test_labels)),
        deploy=flow,
    )
    assert plan.reached and plan.verified_score >= fp32 and plan.verified_score >= plan.default_score
    # Only what the target needs stays in float. Where the default config already holds the float
    # accuracy that is nothing much; where it loses a digit (one of 450 on AVX-512/AMX CPUs, whose
    # kernels round otherwise) the plan keeps one conv in float (conv2: 19% of the parameters).
    assert plan.quantized_fraction >= (0.9 if plan.default_score >= fp32 else 0.75)
    if flow == "fx":  # the exported mapping, applied by hand, reproduces the plan's accuracy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared = prepare_fx(digits.model, qinsight.qconfig_mapping(plan), (calibration[0],))
        for batch in calibration:
            prepared(batch)
        assert digits.accuracy(convert_fx(prepared)) == pytest.approx(plan.verified_score)
