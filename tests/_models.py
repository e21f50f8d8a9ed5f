"""Test models, small and seeded: what a test quantizes (importing it changes no global state)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, dims: Sequence[int] = (16, 32, 32, 8)) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dims[0], dims[1])
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(dims[1], dims[2])
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(dims[2], dims[3])

    def forward(self, x: torch.Tensor) -> Any:
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


class ConvBnReluCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.block = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> Any:
        x = self.block(self.relu1(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class Stream(nn.Module):
    """A streaming voice-activity shape: X86InductorQuantizer observes the Conv1d's weight but hands the
    conv its float weight, and has no LSTMCell pattern: PT2E quantizes nothing of it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.cell = nn.LSTMCell(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.cell(torch.relu(self.conv(x)).mean(-1))
        return hidden  # type: ignore[no-any-return]


class TwiceLinear(nn.Module):
    """One Linear called twice per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> Any:
        return self.out(self.shared(torch.relu(self.shared(x))))


class DataDependent(nn.Module):
    """Control flow on a value: neither FX tracing nor torch.export can follow it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x) if x.sum() > 0 else -self.fc(x)
        return out


def seeded(model: nn.Module, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    for p in model.parameters():
        nn.init.normal_(p, std=0.3)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


class ShapeBranching(nn.Module):
    """A branch on the batch's shape: FX's symbolic trace cannot take it, torch.export specializes it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x))
        return self.fc2(hidden if x.shape[0] > 1 else hidden * 2)


class ResidualBlock(nn.Module):
    """A pre-norm attention + MLP block, as in every transformer."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2, self.up, self.act, self.down = (
            nn.LayerNorm(dim),
            nn.Linear(dim, 4 * dim),
            nn.GELU(),
            nn.Linear(4 * dim, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        x = x + self.proj(torch.matmul(attention, v).transpose(1, 2).reshape(b, s, d))
        out: torch.Tensor = x + self.down(self.act(self.up(self.norm2(x))))
        return out


def conv_bn_model() -> nn.Module:
    model = seeded(ConvBnReluCNN())
    for bn in (model.bn1, model.block[1]):  # BatchNorms far from identity, so an unfolded comparison shows
        assert isinstance(bn, nn.BatchNorm2d)
        bn.weight.data.uniform_(0.3, 2.0)
        bn.running_var.uniform_(0.2, 3.0)
    return model
