"""Test data: seeded batches, real sentences and real photos in reach offline (MODELS.md)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch


def gaussian_batches(shape: tuple[int, ...], n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


def shifting_batches(shape: tuple[int, ...], n: int, seed: int = 0) -> list[torch.Tensor]:
    """Non-stationary data: batches alternate between [-10, 0) and [0, 10) (torch's test 12)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(*shape, generator=g) * 10 - (10 if i % 2 == 0 else 0) for i in range(n)]


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


def residual_stream(batches: int, seed: int) -> list[torch.Tensor]:
    """Token activations whose residual stream carries two massive channels, as trained transformers' do."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batches):
        x = torch.randn(8, 16, 64, generator=g)
        x[..., :2] *= 40.0
        out.append(x)
    return out


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
