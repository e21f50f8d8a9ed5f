"""A Llama-shaped decoder stack of any width: the shape of the LLMs people quantize on GPUs.

Pre-norm blocks of RMSNorm, causal SDPA attention (q/k/v/o projections) and a
SwiGLU MLP (gate/up/down), random weights (std 0.02), and one massive
activation as real LLMs have: a residual channel that layer 1's ``down_proj``
writes 400 times larger. :func:`llama_stack` at width 4096 (MLP 11008) is the
7B shape the GPU benchmark measures; at width 512 (MLP 1408) it runs on a
laptop's CPU with the same per-tensor costs and the same report structure.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class DecoderBlock(nn.Module):
    def __init__(self, width: int, mlp: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(width)
        self.q_proj = nn.Linear(width, width, bias=False)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width, bias=False)
        self.o_proj = nn.Linear(width, width, bias=False)
        self.mlp_norm = RMSNorm(width)
        self.gate_proj = nn.Linear(width, mlp, bias=False)
        self.up_proj = nn.Linear(width, mlp, bias=False)
        self.down_proj = nn.Linear(mlp, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)
        batch, tokens, width = h.shape
        q, k, v = (
            proj(h).view(batch, tokens, self.heads, width // self.heads).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(attended.transpose(1, 2).reshape(batch, tokens, width))
        h = self.mlp_norm(x)
        out: torch.Tensor = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return out


class DecoderStack(nn.Module):
    def __init__(self, width: int, mlp: int, layers: int, heads: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DecoderBlock(width, mlp, heads) for _ in range(layers)])
        self.norm = RMSNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.norm(x)
        return out


def llama_stack(width: int = 512, mlp: int = 1408, layers: int = 4, heads: int = 8, seed: int = 0) -> DecoderStack:
    """The stack in eval mode, its weights drawn from ``seed``; layer 1 writes one massive channel."""
    torch.manual_seed(seed)
    model = DecoderStack(width, mlp, layers, heads)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.02)
        if layers > 1:
            cast(DecoderBlock, model.layers[1]).down_proj.weight[7].mul_(400.0)
    return model.eval()


def stack_batches(width: int = 512, tokens: int = 256, count: int = 4, seed: int = 1) -> list[torch.Tensor]:
    """``count`` batches of one sequence of ``tokens`` hidden states (the stack reads embeddings)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, tokens, width, generator=generator) for _ in range(count)]


__all__ = ["DecoderStack", "llama_stack", "stack_batches"]
