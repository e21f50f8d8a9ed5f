"""What the flow really does, in a plan. No config kills it: a candidate the flow cannot build or run is left
out, its error said once in the plan's notes, and the search goes on; only the flow's default config failing
ends the plan, in one error. And its figures are read from the converted model."""

from __future__ import annotations

import pytest
import torch
from _data import outlier_batches
from _models import Stream
from torch import nn

import qinsight
from qinsight.core.errors import QinsightError
from qinsight.types import NoteKind, SuggestionKind


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


def test_a_config_torch_cannot_run_is_left_out_and_the_plan_goes_on() -> None:
    # torch's input-weight equalization raises on (batch, seq, features) Linear inputs (docs/divergences.md).
    # A report made on rows suggests equalizing the first Linear; planned on sequences of the same rows, the
    # config with that equalization cannot be calibrated: before, torch's ValueError ended the whole plan.
    model, rows = _mlp(), outlier_batches(6, 0)
    report = qinsight.diagnose(model, rows)
    assert [s.fqn for s in report.suggestions if s.equalize] == ["0"]
    sequences = [batch.reshape(8, 8, 32) for batch in rows]
    plan = qinsight.plan(model, sequences[:4], sequences[4:], goal="sqnr>=20", report=report)
    (check,) = [c for c in plan.checks if SuggestionKind.EQUALIZE in c.kinds]
    assert not check.kept and check.why is NoteKind.FLOW_CANNOT_RUN
    (note,) = [n.text for n in plan.notes if n.kind is NoteKind.FAILED_CONFIGS]
    assert "ValueError" in note and "fx flow" in note  # the flow's error, named
    assert plan.equalization_mapping().fqns == () and plan.reached and plan.verified_score >= 20
    # the plan's config, applied as a user would, runs on the sequences and scores what the plan says
    quantized = qinsight.quantize(model, plan, sequences[:4])
    with torch.no_grad():
        reference = torch.cat([model(b) for b in sequences[4:]])
        actual = torch.cat([quantized(b) for b in sequences[4:]])
    assert 20 * torch.log10(reference.norm() / (reference - actual).norm()).item() == pytest.approx(
        plan.verified_score, abs=0.01
    )


def test_a_default_config_the_flow_cannot_run_ends_the_plan_in_one_error() -> None:
    # A float conv takes one unbatched image; fbgemm's quantized conv only (N, C, H, W): the default config
    # itself cannot run on these evaluation images, and every plan starts from it.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    calibration, unbatched = [torch.randn(2, 3, 8, 8) for _ in range(3)], [torch.randn(3, 8, 8) for _ in range(2)]
    assert model(unbatched[0]).shape == (4, 6, 6)
    with pytest.raises(
        QinsightError, match=r"default config cannot quantize and run Sequential .*ValueError: Input shape must be"
    ):
        qinsight.plan(model, calibration, unbatched, goal="sqnr>=20")


def test_a_model_the_flow_leaves_float_is_said_and_its_fraction_is_zero() -> None:
    # X86InductorQuantizer observes a Conv1d's weight but hands the conv its float weight (the dequantize
    # node has no user): nothing of this streaming model is quantized. The plan's fraction is read from
    # the converted graph, not from the modes the search planned (which said 100%).
    pytest.importorskip("torchao")

    torch.manual_seed(0)
    model, batches = Stream().eval(), [torch.randn(4, 8, 20) for _ in range(4)]
    plan = qinsight.plan(model, batches[:3], batches[3:], goal="sqnr>=25", deploy="pt2e")
    assert plan.quantized_fraction == 0.0
    assert [note.kind for note in plan.notes] == [NoteKind.LEFT_FLOAT] and "conv" in plan.notes[0].text
    assert "0.0% of the layers' parameters quantized" in qinsight.to_text(plan)


class _AutocastBlock(nn.Module):
    """A block run with autocast off (as Hugging Face's rotary embeddings are): ``torch.export`` puts it in a
    subgraph that the exported graph reaches through ``get_attr``, a module, not a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            scale = torch.sigmoid(x.float().mean(dim=-1, keepdim=True))
        return self.b(torch.relu(self.a(x * scale)))  # type: ignore[no-any-return]


def test_a_pt2e_plan_runs_through_a_subgraph_the_exported_graph_holds() -> None:
    # before, the simulation asserted that every get_attr is a tensor, and a bare AssertionError ended the plan
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    model = _AutocastBlock().eval()
    data = [torch.randn(8, 16) for _ in range(4)]
    plan = qinsight.plan(model, data[:2], data[2:], goal="sqnr>=20", deploy="pt2e")
    assert plan.reached and plan.verified_score >= 20.0 and plan.quantized_fraction > 0.5


def test_a_plan_does_not_claim_a_target_its_held_out_data_misses() -> None:
    # observers calibrated on inputs of one range; held-out inputs of eight times that range are clipped
    model = _mlp()
    generator = torch.Generator().manual_seed(1)
    calm = [torch.randn(16, 32, generator=generator) for _ in range(8)]
    wild = [8 * torch.randn(16, 32, generator=generator) for _ in range(2)]
    plan = qinsight.plan(model, calm[:4], calm[4:6], goal="sqnr>=25", held_out_data=wild)
    assert plan.target.met(plan.verified_score) and not plan.target.met(plan.held_out_score) and not plan.reached
    assert NoteKind.HELD_OUT_MISS in [note.kind for note in plan.notes]
    # the held-out score is the plan's config, quantized as a user would, on the held-out batches
    quantized = qinsight.quantize(model, plan, calm[:4])
    with torch.no_grad():
        reference, actual = torch.cat([model(b) for b in wild]), torch.cat([quantized(b) for b in wild])
    assert plan.held_out_score == pytest.approx(qinsight.compare.metric_functions.sqnr(reference, actual), abs=1e-9)
    steady = qinsight.plan(model, calm[:4], calm[4:6], goal="sqnr>=25", held_out_data=calm[6:])
    assert steady.reached and steady.held_out_score >= 25.0
    assert "on held-out data" in qinsight.to_text(steady).splitlines()[0]


@pytest.mark.slow
@pytest.mark.extended(10)
def test_a_pt2e_plan_on_an_exported_llm_finishes_and_applies_as_planned() -> None:
    """SmolLM2-135M through torch.export and X86InductorQuantizer, 241 sites (issue: exported LLM graphs).
    Measured (626 s): perplexity 1.017 for real against the default config's 2.114, 92.2% of the layers'
    parameters quantized; the simulation's path was bisected for real where the two disagreed."""
    pytest.importorskip("torchao")
    from _real import smollm2_or_skip

    from qinsight.examples.smollm import HELD_OUT_TEXTS, TEXTS, token_batches

    model = smollm2_or_skip()
    calibration, evaluation = token_batches(TEXTS, tokens=32)[:4], token_batches(HELD_OUT_TEXTS, tokens=32)[:2]
    plan = qinsight.plan(model, calibration, evaluation, goal="perplexity<=1.1", deploy="pt2e")
    assert plan.reached and plan.verified_score <= 1.1 < plan.default_score
    assert plan.quantized_fraction > 0.5
