"""Helpers for testing detector plugins without installing them.

>>> root = write_distribution(tmp_path, "acme-widths", {"acme_widths": SOURCE},  # doctest: +SKIP
...                           {"acme.widths": "acme_widths:WidthDetector"})
>>> monkeypatch.syspath_prepend(root)                                         # doctest: +SKIP

The folder then holds a real ``*.dist-info`` with ``METADATA`` and
``entry_points.txt``, found by ``importlib.metadata`` like an installed one.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

from qinsight.plugin.discovery import DETECTORS


def write_distribution(
    root: Path,
    name: str,
    modules: Mapping[str, str],
    detectors: Mapping[str, str],
    *,
    version: str = "1.0",
) -> Path:
    """Write modules and a dist-info registering ``detectors`` (id -> "module:Class") under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"[{DETECTORS}]", *(f"{detector_id} = {target}" for detector_id, target in detectors.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    importlib.invalidate_caches()
    return root
