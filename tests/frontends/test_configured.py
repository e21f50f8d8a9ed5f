"""diagnose(..., quantizer=q): the findings judged against what the user's PT2E quantizer will do, as
qconfig_mapping= does for FX: asked of the quantizer on the exported graph, a ComposableQuantizer too."""

from __future__ import annotations

import pytest
from _checks import warns_note

import qinsight
from qinsight.examples.builtin import example
from qinsight.types import NoteKind

pytest.importorskip("executorch")

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (  # noqa: E402
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization.pt2e.quantizer import ComposableQuantizer  # noqa: E402


def _verdicts(quantizer: object) -> dict[str, str]:
    chosen = example("cnn")
    report = qinsight.diagnose(
        chosen.model(),
        chosen.data(4),
        deploy=qinsight.types.Deployment(backend="xnnpack", quantizer=quantizer),
        verify=False,
    )
    return {finding.fqn: finding.verdict for finding in report.result("qinsight.per_channel").findings}


@pytest.mark.slow  # four diagnoses through ExecuTorch's quantizer: the whole suite's tier
def test_per_channel_is_judged_against_the_users_quantizer_composed_or_not() -> None:
    per_channel = get_symmetric_quantization_config(is_per_channel=True)
    per_tensor = get_symmetric_quantization_config(is_per_channel=False)
    assert set(_verdicts(XNNPACKQuantizer().set_global(per_channel)).values()) == {"per-channel in use"}
    assert set(_verdicts(XNNPACKQuantizer().set_global(per_tensor)).values()) == {"per-channel recommended"}
    composed = ComposableQuantizer(
        [XNNPACKQuantizer().set_module_name("fc", per_channel), XNNPACKQuantizer().set_global(per_tensor)]
    )
    verdicts = _verdicts(composed)
    assert verdicts.pop("fc") == "per-channel in use"
    assert set(verdicts.values()) == {"per-channel recommended"}


def test_a_layer_the_quantizer_leaves_float_is_not_quantized_in_the_report() -> None:
    """XNNPACKQuantizer's module-name filter takes a pattern only if all its nodes match: conv1's
    conv-bn-relu has bn1 and relu1 too, so naming conv1 leaves it float, and the report says so."""
    chosen = example("cnn")
    config = get_symmetric_quantization_config(is_per_channel=True)
    quantizer = XNNPACKQuantizer().set_module_name("fc", config).set_module_name("conv1", config)
    report = qinsight.diagnose(
        chosen.model(),
        chosen.data(4),
        deploy=qinsight.types.Deployment(backend="xnnpack", quantizer=quantizer),
        verify=False,
    )
    layers = {site.fqn: site for site in report.sites if site.kind.is_layer}
    assert layers["fc"].quantized and layers["fc"].weight_scheme is qinsight.types.WeightScheme.PER_CHANNEL
    assert not layers["conv1"].quantized and layers["conv1"].weight_scheme is None


def test_a_quantizer_beside_a_mapping_or_not_a_quantizer_is_one_error() -> None:
    from torch.ao.quantization import get_default_qconfig_mapping

    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(2)
    with pytest.raises(qinsight.errors.InvalidParameterError, match="None beside qconfig_mapping="):
        qinsight.diagnose(
            model,
            batches,
            deploy=qinsight.types.Deployment(
                qconfig_mapping=get_default_qconfig_mapping("x86"), quantizer=XNNPACKQuantizer()
            ),
        )
    with pytest.raises(qinsight.errors.InvalidParameterError, match="^Deployment: quantizer='str' is invalid"):
        qinsight.diagnose(model, batches, deploy=qinsight.types.Deployment(quantizer="xnnpack"), verify=False)
    # the former keyword's mistake is diagnose's, and the shorthand takes a backend's name
    with pytest.raises(qinsight.errors.InvalidParameterError, match="^diagnose: quantizer='str' is invalid"):
        qinsight.diagnose(model, batches, quantizer="xnnpack", verify=False)
    assert qinsight.diagnose(model, batches, deploy="xnnpack", verify=False).metadata.backend == "xnnpack"


def test_the_backend_is_the_one_the_quantizer_is_for_unless_given() -> None:
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer

    from qinsight.core.backend import backend_of
    from qinsight.planning.request import plan_request

    def quantizer_backend(quantizer: object) -> str | None:
        record = backend_of(quantizer)
        return None if record is None else record.name

    chosen = example("cnn")
    model, batches = chosen.model(), chosen.data(2)
    assert quantizer_backend(ComposableQuantizer([XNNPACKQuantizer(), XNNPACKQuantizer()])) == "xnnpack"
    assert quantizer_backend(ComposableQuantizer([XNNPACKQuantizer(), X86InductorQuantizer()])) is None
    report = qinsight.diagnose(model, batches, deploy=XNNPACKQuantizer(), verify=False)
    assert report.metadata.backend == "xnnpack"
    with warns_note(NoteKind.UNEQUALIZED):
        assert quantizer_backend(qinsight.pt2e_quantizer(report)) == "xnnpack"  # qinsight's own, seen through
    request = plan_request(
        goal=qinsight.types.Goal.of("sqnr>=30", "plan"),
        deploy=qinsight.types.Deployment(quantizer=XNNPACKQuantizer()),
        calibration_data=batches,
        evaluation_data=batches,
    )
    assert (request.backend, request.flow) == ("xnnpack", "pt2e")
    with pytest.raises(
        qinsight.errors.InvalidParameterError, match="'xnnpack', the backend your XNNPACKQuantizer quantizes"
    ):
        qinsight.diagnose(model, batches, deploy=qinsight.types.Deployment(backend="x86", quantizer=XNNPACKQuantizer()))
    with pytest.raises(qinsight.errors.InvalidParameterError, match="a flow your X86InductorQuantizer quantizes in"):
        qinsight.diagnose(model, batches, deploy=X86InductorQuantizer(), verify="fx")
