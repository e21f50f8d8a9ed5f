"""The zoo sweep (docs/zoo.md): every torchvision classification architecture and five Hugging Face ones,
built from code with random weights, through diagnose, compare_configs (x86 against XNNPACK) and
verification. Each step ends in its result or in one QinsightError line; a raw exception is a bug the
sweep found. torchvision lives in a folder of its own (``_zoo.INSTALL``), or these are skipped."""

from __future__ import annotations

import _zoo
import pytest


@pytest.mark.extended(1)
@pytest.mark.parametrize("name", [*_zoo.TORCHVISION_NAMES, *_zoo.HF_NAMES])
def test_an_architecture_runs_or_says_in_one_line_what_is_not_supported(name: str) -> None:
    if name not in _zoo.names():
        pytest.skip(f"the sweep's torchvision or transformers is not installed: {_zoo.INSTALL}")
    pytest.importorskip("executorch")
    row = _zoo.isolated(name, timeout=900)
    assert "failed" not in row, row
    outcomes = {step: row[step] for step in ("diagnose", "compare", "verify")}
    raw = {step: outcome["said"] for step, outcome in outcomes.items() if outcome["raw"]}
    assert not raw, f"{name}: a raw exception, not a QinsightError line: {raw}"
    longer = {step: outcome["lines"] for step, outcome in outcomes.items() if outcome["lines"] > 1}
    assert not longer, f"{name}: an error of more than one line: {longer}"
