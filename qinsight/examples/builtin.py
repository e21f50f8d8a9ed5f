"""Small built-in example models with calibration data, for the README and the CLI (``--example``).

All are seeded and need nothing but torch: a conv-bn-relu CNN, ResNet-18's layout and a
transformer encoder with (batch, sequence, features) Linear inputs. The
transformer's data shifts from batch to batch, so dynamic quantization is
worth recommending for some of its Linear layers.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch
from torch import nn

from qinsight.core.errors import NotFoundError


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.block = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.pool(self.block(x))
        logits: torch.Tensor = self.fc(torch.flatten(x, 1))
        return logits


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + self.down(x))
        return out


class ResNet18(nn.Module):
    """ResNet-18's layout (torchvision's widths and strides), randomly initialized."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        widths, blocks, cin = (64, 128, 256, 512), [], 64
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))
        return out


class EncoderLayer(nn.Module):
    """A pre-norm transformer encoder layer written with plain Linear modules."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, s, d))
        out: torch.Tensor = x + self.fc2(self.act(self.fc1(self.norm2(x))))
        return out


class TinyEncoder(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4, num_classes: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, 2 * dim) for _ in range(layers))
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        logits: torch.Tensor = self.head(x.mean(dim=1))
        return logits


@attrs.frozen(kw_only=True)
class Example:
    name: str
    description: str
    model: Callable[[], nn.Module]
    data: Callable[[int], list[torch.Tensor]]


def _seeded_model(factory: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return factory().eval()

    return build


def _cnn_data(batches: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(8, 3, 32, 32, generator=generator) for _ in range(batches)]


def _image_data(batches: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(4, 3, 224, 224, generator=generator) for _ in range(batches)]


def _encoder_data(batches: int) -> list[torch.Tensor]:
    # Each batch has its own scale and offset: the non-stationary input that
    # makes static activation ranges a poor fit.
    generator = torch.Generator().manual_seed(2)
    out = []
    for index in range(batches):
        scale = 0.25 * 4.0 ** (index % 4)
        out.append(scale * torch.randn(4, 16, 64, generator=generator) + index % 3)
    return out


EXAMPLES: dict[str, Example] = {
    "cnn": Example(
        name="cnn",
        description="conv-bn-relu CNN on random 32x32 images",
        model=_seeded_model(SmallCNN),
        data=_cnn_data,
    ),
    "encoder": Example(
        name="encoder",
        description="2-layer transformer encoder on (batch, seq, features) inputs with shifting scale",
        model=_seeded_model(TinyEncoder),
        data=_encoder_data,
    ),
    "resnet18": Example(
        name="resnet18",
        description="ResNet-18 layout, random weights, on random 224x224 images",
        model=_seeded_model(ResNet18),
        data=_image_data,
    ),
}


def example(name: str) -> Example:
    try:
        return EXAMPLES[name]
    except KeyError:
        raise NotFoundError("example", name, EXAMPLES) from None
