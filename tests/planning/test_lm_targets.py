"""A language model planned to targets on its logits: ``kl<=`` (lower is better), ``token_agreement>=``,
``perplexity<=``."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import qinsight


class TinyLM(nn.Module):
    """Token embeddings, one residual MLP block and a head over a 200-token vocabulary: (batch, seq, 200) logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(200, 32)
        self.up = nn.Linear(32, 128)
        self.down = nn.Linear(128, 32)
        self.head = nn.Linear(32, 200)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        hidden = hidden + self.down(torch.relu(self.up(hidden)))
        out: torch.Tensor = self.head(hidden)
        return out


def test_a_plan_reaches_targets_on_the_next_token_distribution() -> None:
    torch.manual_seed(0)
    model = TinyLM().eval()
    g = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, 200, (4, 16), generator=g) for _ in range(6)]
    for target, better in (("kl<=0.005", lambda a, b: a <= b), ("token_agreement>=0.97", lambda a, b: a >= b)):
        plan = qinsight.plan(model, tokens[:3], tokens[3:], goal=target)
        assert plan.reached and plan.metric == target.split("<")[0].split(">")[0]
        assert better(plan.verified_score, plan.default_score)
        # the score is the metric on the logits, per position, of the config quantized as a user would
        quantized = qinsight.quantize(model, plan, tokens[:3])
        with torch.no_grad():
            reference = torch.cat([model(t) for t in tokens[3:]])
            actual = torch.cat([quantized(t) for t in tokens[3:]])
        metric = (
            qinsight.compare.metric_functions.kl
            if plan.metric == "kl"
            else qinsight.compare.metric_functions.token_agreement
        )
        assert metric(reference, actual) == plan.verified_score


def test_a_static_plan_scores_perplexity_on_the_batches_own_next_tokens() -> None:
    torch.manual_seed(0)
    model = TinyLM().eval()
    with torch.no_grad():
        model.head.weight.mul_(6.0)  # confident predictions: quantization moves the perplexity
    g = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, 200, (4, 16), generator=g) for _ in range(6)]
    plan = qinsight.plan(model, tokens[:3], tokens[3:], goal="perplexity<=1.02")
    quantized = qinsight.quantize(model, plan, tokens[:3])

    def loss(m: nn.Module) -> float:
        with torch.no_grad():
            logits = torch.cat([m(t)[:, :-1].reshape(-1, 200) for t in tokens[3:]]).double()
        return float(torch.nn.functional.cross_entropy(logits, torch.cat([t[:, 1:].reshape(-1) for t in tokens[3:]])))

    assert plan.metric == "perplexity" and plan.reached == (plan.verified_score <= 1.02)
    assert plan.verified_score == pytest.approx(math.exp(loss(quantized) - loss(model)), rel=1e-9)
