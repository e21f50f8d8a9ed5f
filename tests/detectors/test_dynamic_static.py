"""DynamicStaticDetector: torch's test 12 ported, differential tests against torch's
DynamicStaticDetector (S to 1e-5, equal verdicts), the robust statistic, validation."""

from __future__ import annotations

import copy

import pytest
import torch
from _data import gaussian_batches, shifting_batches
from _models import MLP, ConvBnReluCNN, seeded
from _peers import prepared_fx, torch_model_report, torch_name
from torch import nn
from torch.ao.quantization.fx._model_report.detector import DynamicStaticDetector as TorchDynamicStatic

import qinsight
from qinsight.detectors import DynamicStaticDetector, DynamicStaticFinding, Stationarity
from qinsight.errors import InvalidParameterError
from qinsight.types import DataCondition


def dynamic_static(report: qinsight.Report) -> dict[str, DynamicStaticFinding]:
    findings = report.result("qinsight.dynamic_static").findings
    return {f.fqn: f for f in findings if isinstance(f, DynamicStaticFinding)}


class ShiftingInputModel(nn.Module):
    """A Linear whose input alternates sign from batch to batch (torch's test 12).

    ``fc`` has positive weights, so its output follows its input's sign and is
    not stationary either; ``out`` sees only the ReLU's positive half.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)
        with torch.no_grad():
            self.fc.weight.uniform_(0.1, 1.0)
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.out(torch.relu(self.fc(x)))
        return y


CASES = {
    "mlp": (lambda: seeded(MLP()), lambda: gaussian_batches((8, 16), 12)),
    "cnn": (lambda: seeded(ConvBnReluCNN()), lambda: gaussian_batches((4, 3, 12, 12), 10)),
    "shifting": (lambda: ShiftingInputModel().eval(), lambda: shifting_batches((16, 8), 12)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_differential_against_torch(case: str) -> None:
    build, batches = CASES[case]
    data = batches()
    prepared = prepared_fx(build(), data[0])
    entries = torch_model_report(prepared, data, {TorchDynamicStatic()})["dynamic_vs_static_detector"][1]
    ours = dynamic_static(qinsight.diagnose(copy.deepcopy(prepared), data, detectors=[DynamicStaticDetector()]))
    assert len(ours) == len(entries) > 0
    for fqn, finding in ours.items():
        theirs = entries[torch_name(fqn, entries)]
        assert finding.input.statistic == pytest.approx(
            theirs["input_activation_dynamic_static_comp_stat"].item(), abs=1e-5
        )
        assert finding.output.statistic == pytest.approx(
            theirs["output_activation_dynamic_static_comp_stat"].item(), abs=1e-5
        )
        assert finding.dynamic_recommended == bool(theirs["dynamic_recommended"])
        assert finding.dynamic_supported == theirs["is_dynamic_supported"]
        classes = (
            "stationary" if finding.input.stationary(0.5) else "non-stationary",
            "stationary" if finding.output.stationary(0.5) else "non-stationary",
        )
        assert classes == (
            theirs["input_activation_dynamic_static_data_classification"],
            theirs["output_activation_dynamic_static_data_classification"],
        )


def test_nested_detection_case() -> None:
    # torch 12: inputs alternating between randint(-10, 0) and randint(0, 10).
    g = torch.Generator().manual_seed(3)
    data = [
        torch.randint(-10, 0, (16, 8), generator=g).float()
        if i % 2
        else torch.randint(0, 10, (16, 8), generator=g).float()
        for i in range(20)
    ]
    report = qinsight.diagnose(ShiftingInputModel().eval(), data, detectors=[DynamicStaticDetector()])
    fc = dynamic_static(report)["fc"]
    assert fc.input.stationary(fc.tolerance) is False
    assert fc.dynamic_recommended is True and fc.actionable
    assert report.suggestion("fc") == qinsight.types.QuantSuggestion(
        fqn="fc", activation=qinsight.types.ActivationMode.DYNAMIC, sources=("qinsight.dynamic_static",)
    )
    assert "dynamic recommended" in qinsight.to_text(report)


def test_stationary_data_recommends_static(mlp: nn.Module) -> None:
    report = qinsight.diagnose(mlp, gaussian_batches((64, 16), 10), detectors=[DynamicStaticDetector()])
    findings = dynamic_static(report)
    assert all(f.dynamic_recommended is False and not f.actionable for f in findings.values())
    assert {s.activation for s in report.suggestions} == {qinsight.types.ActivationMode.STATIC}


def test_conv_non_stationary_is_reported_but_kept_static() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 1)).eval()
    with torch.no_grad():
        model[0].weight.uniform_(0.1, 1.0)  # positive: the output shifts with the input
    report = qinsight.diagnose(model, shifting_batches((2, 3, 4, 4), 10), detectors=[DynamicStaticDetector()])
    finding = dynamic_static(report)["0"]
    assert finding.dynamic_recommended is True and not finding.dynamic_supported
    assert finding.verdict == "non-stationary, dynamic unsupported" and not finding.actionable
    suggestion = report.suggestion("0")
    assert suggestion is not None and suggestion.activation is qinsight.types.ActivationMode.STATIC


def test_variance_statistic_ignores_a_spike_torch_flags() -> None:
    # One 30-sigma spike in stationary data: torch's S (range) says dynamic, the variance statistic does not.
    model = nn.Sequential(nn.Linear(64, 64)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(64))
        model[0].bias.zero_()
    data = gaussian_batches((16, 64), 20)
    data[5][3, 7] = 30.0
    by_range = dynamic_static(qinsight.diagnose(model, data, detectors=[DynamicStaticDetector()]))["0"]
    by_variance = dynamic_static(
        qinsight.diagnose(model, data, detectors=[DynamicStaticDetector(statistic=Stationarity.VARIANCE)])
    )["0"]
    assert by_range.output.statistic is not None and by_range.output.statistic < 0.5
    assert by_range.dynamic_recommended is True
    assert by_variance.output.statistic is not None and by_variance.output.statistic > 0.5
    assert by_variance.dynamic_recommended is False


def test_variance_statistic_still_sees_shifting_data() -> None:
    report = qinsight.diagnose(
        ShiftingInputModel().eval(),
        shifting_batches((16, 8), 12),
        detectors=[DynamicStaticDetector(statistic="variance")],  # type: ignore[arg-type]
    )
    fc = dynamic_static(report)["fc"]
    assert fc.statistic is Stationarity.VARIANCE
    assert fc.input.statistic is not None and fc.input.statistic < 0.5


def test_constant_input_gives_a_finding_not_an_error() -> None:
    # torch raises "Range for Epoch is 0" and loses the whole report.
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.zero_()
    report = qinsight.diagnose(model, [torch.ones(2, 4)] * 3, detectors=[DynamicStaticDetector()])
    finding = dynamic_static(report)["0"]
    assert finding.input.condition is DataCondition.CONSTANT and finding.input.statistic is None
    assert finding.output.condition is DataCondition.CONSTANT
    assert finding.dynamic_recommended is False  # a constant fits a static range exactly
    assert "constant" in finding.reason()


@pytest.mark.parametrize("tolerance", [0.0, 1.0, -3.0, 1.5, float("nan")])
def test_invalid_tolerance_is_refused(tolerance: float) -> None:
    # torch accepts DynamicStaticDetector(tolerance=-3) and then every verdict is the same.
    with pytest.raises(InvalidParameterError, match="tolerance"):
        DynamicStaticDetector(tolerance=tolerance)


def test_invalid_statistic_is_refused() -> None:
    with pytest.raises(ValueError, match="'median' is not a valid Stationarity"):
        DynamicStaticDetector(statistic="median")  # type: ignore[arg-type]
