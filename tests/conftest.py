"""Fixtures; the helpers themselves live in _support.py (importable from tests)."""

from __future__ import annotations

import pytest
from torch import nn

from _support import MLP, ConvBnReluCNN, seeded


@pytest.fixture
def mlp() -> nn.Module:
    return seeded(MLP())


@pytest.fixture
def cnn() -> nn.Module:
    return seeded(ConvBnReluCNN())
