"""A small CNN trained on scikit-learn's handwritten digits: the one labelled task in reach offline.

``load_digits`` reads 1,797 real 8x8 digits (labels 0-9) from inside the scikit-learn wheel
(the ``digits`` extra). :func:`digits_cnn` trains a seeded 3-conv + BatchNorm CNN on a
stratified 1,347 / 450 split in a few seconds on one thread; re-runs give the same weights, so
tests can ask for true-label accuracy before and after quantization.
"""

from __future__ import annotations

import attrs
import torch
from torch import nn


class DigitsCNN(nn.Module):
    """Three conv-BN-ReLU blocks, a max pool, a global average pool and a Linear head (~24k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn3 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.pool(self.relu(self.bn2(self.conv2(x))))
        x = self.relu(self.bn3(self.conv3(x)))
        logits: torch.Tensor = self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
        return logits


@attrs.frozen
class Digits:
    """The trained model (in eval mode) and its split: images (N, 1, 8, 8) in [0, 1], labels (N,)."""

    model: DigitsCNN
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor

    def accuracy(self, model: nn.Module) -> float:
        """The fraction of the 450 test digits ``model`` labels correctly."""
        with torch.no_grad():
            predicted = model(self.test_images).argmax(dim=1)
        return float((predicted == self.test_labels).double().mean())


def digits_cnn(*, epochs: int = 30, seed: int = 0) -> Digits:
    """Train :class:`DigitsCNN` on scikit-learn's digits (seeded, one thread so re-runs are identical)."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError("the digits example needs scikit-learn: pip install 'qinsight[digits]'") from error
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    train, test = train_test_split(range(len(labels)), test_size=450, stratify=data.target, random_state=seed)
    torch.manual_seed(seed)  # the initial weights too
    digits = Digits(DigitsCNN(), images[train], labels[train], images[test], labels[test])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _train(digits, epochs, seed)
    finally:
        torch.set_num_threads(threads)
    digits.model.eval()
    return digits


def _train(digits: Digits, epochs: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    model = digits.model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    for _ in range(epochs):
        order = torch.randperm(len(digits.train_labels), generator=generator)
        for batch in torch.split(order, 64):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(digits.train_images[batch]), digits.train_labels[batch])
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        schedule.step()


__all__ = ["Digits", "DigitsCNN", "digits_cnn"]
