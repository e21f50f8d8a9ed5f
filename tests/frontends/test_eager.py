"""The eager frontend: models FX cannot trace, and the same verdicts as FX where both apply."""

from __future__ import annotations

import copy

import attrs
import pytest
import torch
from _checks import hooks_left
from _data import gaussian_batches
from _models import MLP, ConvBnReluCNN, TwiceLinear, seeded
from _real import mobilenet_v2_or_skip
from torch import nn

import qinsight
from qinsight.errors import FrontendError
from qinsight.examples import example


class Branchy(nn.Module):
    """A data-dependent branch on a tensor value: FX cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.pos = nn.Linear(16, 4)
        self.neg = nn.Linear(16, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        out: torch.Tensor = self.pos(h) if x.mean() > 0 else self.neg(h)
        return out


def test_untraceable_model_is_diagnosed_eagerly() -> None:
    torch.manual_seed(0)
    model = Branchy().eval()
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(16, 8, generator=g) + (1.0 if i % 2 else -1.0) for i in range(6)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = qinsight.diagnose(model, data)
    assert report.metadata.frontend == "eager"
    # sites in first-call order; the first batch (mean < 0) took the negative branch; unused never ran
    assert [s.fqn for s in report.sites if s.kind.is_layer] == ["fc1", "neg"]
    assert {r.detector for r in report.results} == {
        "qinsight.per_channel",
        "qinsight.dynamic_static",
        "qinsight.equalization",
        "qinsight.outliers",
        "qinsight.precision",
        "qinsight.range_conflict",
    }
    assert not report.failures and hooks_left(model) == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    neg = report.observation("neg", qinsight.types.Side.PRE)
    assert neg is not None and neg.stats.batches == 3  # observed on every batch that took the branch


def same_verdicts(model: nn.Module, data: list[torch.Tensor]) -> None:
    # what the detectors find, not what FX's verification keeps of it (the eager frontend verifies nothing)
    via_fx = qinsight.diagnose(copy.deepcopy(model), data, frontend="fx", verify=False)
    via_eager = qinsight.diagnose(copy.deepcopy(model), data, frontend="eager", verify=False)
    assert (via_fx.metadata.frontend, via_eager.metadata.frontend) == ("fx", "eager")
    # the eager frontend reads no graph: what feeds a site and which clip reads it are FX's alone
    assert via_eager.sites == tuple(attrs.evolve(site, source=None, clip=None) for site in via_fx.sites)
    assert via_eager.results == via_fx.results
    assert via_eager.suggestions == via_fx.suggestions
    assert via_eager.observations == via_fx.observations
    assert via_eager.equalization_mapping == via_fx.equalization_mapping


@pytest.mark.parametrize("name", ["mlp", "cnn", "encoder", "twice"])
def test_same_verdicts_as_fx(name: str) -> None:
    if name == "mlp":
        same_verdicts(seeded(MLP()), gaussian_batches((16, 16), 4))
    elif name == "cnn":
        same_verdicts(seeded(ConvBnReluCNN()), gaussian_batches((2, 3, 12, 12), 4))
    elif name == "twice":
        same_verdicts(seeded(TwiceLinear()), gaussian_batches((4, 8), 3))
    else:
        chosen = example("encoder")
        same_verdicts(chosen.model(), chosen.data(4))


@pytest.mark.slow
@pytest.mark.extended(1)  # MobileNetV2's verdicts across frontends in CI: tests/frontends/test_exported.py
def test_real_mobilenet_v2_same_verdicts() -> None:
    model = mobilenet_v2_or_skip()
    same_verdicts(model, gaussian_batches((2, 3, 224, 224), 2))


def test_instrument_needs_an_example_for_eager() -> None:
    model = Branchy().eval()
    with pytest.raises(FrontendError, match="pass example_inputs="):
        with qinsight.instrument(model, frontend="eager"):
            pass
    with pytest.raises(FrontendError, match="cannot be FX-traced.*example_inputs="):
        with qinsight.instrument(model):
            pass
    x = torch.randn(4, 8) + 1
    with qinsight.instrument(model, example_inputs=x) as session:
        model(x)
        model(x)
    report = session.report()
    assert report.metadata.frontend == "eager" and report.metadata.batches == 2
    assert [s.fqn for s in report.sites] == ["fc1", "pos"]


def test_failing_example_batch_is_a_frontend_error() -> None:
    with pytest.raises(FrontendError, match="the example batch failed in Branchy: RuntimeError"):
        qinsight.diagnose(Branchy(), [torch.randn(2, 5)], frontend="eager")


def test_unknown_frontend_is_refused() -> None:
    with pytest.raises(qinsight.errors.InvalidParameterError, match="frontend='onnx'"):
        qinsight.diagnose(seeded(MLP()), [torch.randn(2, 16)], frontend="onnx")  # type: ignore[arg-type]


class _Positions(nn.Module):
    """Token and position embeddings, the positions an integer add (as Hugging Face models count them):
    batches of different lengths run, and integer arithmetic is no op to quantize."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(50, 16), nn.Embedding(64, 16)
        self.fc = nn.Linear(16, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        where = torch.arange(ids.shape[1]) + 2  # an int64 add, its one axis as long as the text
        x = self.tokens(ids) + self.positions(where)
        return self.fc(x)  # type: ignore[no-any-return]


def test_integer_ops_are_no_sites_and_texts_of_any_length_calibrate() -> None:
    # before, the position add was a site observed along its one axis, and a shorter text ended calibration
    torch.manual_seed(0)
    texts = [torch.randint(0, 50, (1, length)) for length in (12, 9, 15)]
    report = qinsight.diagnose(_Positions().eval(), texts, frontend="eager")
    adds = [s.fqn for s in report.sites if s.kind.value == "add"]
    assert adds == ["add#1"]  # the float add of the embeddings; add#0, on positions, is integer arithmetic
    assert report.metadata.batches == 3
