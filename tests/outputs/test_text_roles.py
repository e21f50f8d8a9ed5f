"""An LLM's report reads by role: the modules of its repeated blocks one row per role
(``layers.*.down_proj (16)``), every module's row with ``--all``."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import qinsight
from qinsight.examples.stack import llama_stack, stack_batches
from qinsight.outputs.roles import Layout, by_role, capped, role_of
from qinsight.outputs.text import shared_tail


@pytest.fixture(scope="module")
def report() -> qinsight.Report:
    # how the text reads, not whether the config holds: unverified, for speed
    return qinsight.diagnose(
        llama_stack(width=32, mlp=88, layers=16, heads=4), stack_batches(width=32, tokens=16, count=2), verify=False
    )


def test_role_of_names_a_place_in_a_repeated_block() -> None:
    assert role_of("model.layers.11.mlp.down_proj") == "model.layers.*.mlp.down_proj"
    assert role_of("layers.3.attn.add#0") == "layers.*.attn.add#0"
    assert role_of("lm_head") == "lm_head" and role_of("0") == "0"  # no block, or a bare index: its own


def test_a_16_block_report_reads_by_role_and_all_lists_every_module(report: qinsight.Report) -> None:
    short, every = qinsight.to_text(report), qinsight.to_text(report, everything=True)
    assert len(short.splitlines()) < len(every.splitlines()) / 3
    # the config: one row per role and setting, with how many modules share it; every module with --all
    config = short[short.index("Suggested config") :]
    assert re.search(r"^  layers\.\*\.down_proj \(\d+\) +activation \w+, weight per_channel$", config, re.MULTILINE)
    assert all(f"layers.{i}.down_proj " in every for i in range(16))
    # a finding's numbers differ per module: the worst one's stand for its role, the next two named
    grouped = [line for line in short.splitlines() if re.match(r"^    layers\.\*\.", line)]
    assert grouped and all(
        re.search(r"\(\d+\) +worst layers\.\d+\.\S+: .*; next layers\.\d+\.", line) for line in grouped
    )
    # a small report's sections are short: every module keeps its own row
    small = qinsight.diagnose(
        llama_stack(width=32, mlp=88, layers=1, heads=4), stack_batches(width=32, tokens=16, count=2), verify=False
    )
    assert "*" not in qinsight.to_text(small) and "layers.0.down_proj " in qinsight.to_text(small)


@given(blocks=st.integers(0, 40), group_above=st.integers(0, 30), role_rows=st.integers(0, 12))
def test_a_layout_bounds_a_sections_rows_and_full_shows_every_one(
    blocks: int, group_above: int, role_rows: int
) -> None:
    rows = [(f"layers.{i}.{name}", f"{i}") for i in range(blocks) for name in ("q", "k", "up", "down")]
    layout = Layout(group_above=group_above, role_rows=role_rows)
    grouped = by_role(rows, layout, same_text=True)
    # a short section keeps each module's row; a long one reads one row per role, naming how many share it
    assert grouped == rows if len(rows) <= group_above else len(grouped) == min(4, len(rows))
    shown, more = capped(grouped, layout)
    assert shown == grouped[: len(shown)] and len(shown) + more == len(grouped)
    assert more == 0 or len(shown) == role_rows  # no "1 more" line: one more row is shown instead
    assert by_role(rows, Layout.full(), same_text=True) == rows and capped(rows, Layout.full()) == (rows, 0)


def test_a_roles_row_names_its_worst_modules_first(report: qinsight.Report) -> None:
    outliers = [f for f in report.result("qinsight.outliers").findings if f.verdict == "outlier channels"]
    by_role: dict[str, list[qinsight.types.Finding]] = {}
    for finding in outliers:
        by_role.setdefault(role_of(finding.fqn), []).append(finding)
    role, members = max(by_role.items(), key=lambda item: len(item[1]))
    ranked = sorted(members, key=lambda f: -(f.severity() or 0.0))
    row = next(
        line for line in qinsight.to_text(report).splitlines() if line.startswith(f"    {role} ({len(members)})")
    )
    assert f"worst {ranked[0].fqn}: {ranked[0].reason()}"[:60] in row
    assert f"next {ranked[1].fqn}, {ranked[2].fqn}" in row


@pytest.mark.slow
def test_an_llm_report_fits_a_screen_and_names_its_worst_layers() -> None:
    # SmolLM2-135M's real weights: 211 Linears, 545 ops around them, 30 decoder layers
    from _real import smollm2_or_skip

    from qinsight.examples.smollm import token_batches

    report = qinsight.diagnose(smollm2_or_skip(), token_batches(), model_name="SmolLM2-135M", verify=False)
    text = qinsight.to_text(report)
    assert len(text.splitlines()) <= 60, text
    # the massive activations of layers 11 and 28's down_proj inputs, named as their role's worst
    assert "layers.*.mlp.down_proj (30)     worst layers.28.mlp.down_proj" in text
    assert "layers.*.mlp.down_proj (9)" in text and "worst layers.11.mlp.down_proj" in text
    # a detector's non-suggestion is one line; the kept-float ops one line in the config; conflicts one line
    assert sum("FX cannot equalize a Linear on 3-D inputs" in line for line in text.splitlines()) == 1
    assert sum(line.startswith("  keep in float (") for line in text.splitlines()) == 1
    assert sum(line.startswith("  conflict") for line in text.splitlines()) == 1
    assert len(qinsight.to_text(report, everything=True).splitlines()) > 1000  # --all keeps every row


def test_what_every_reason_of_a_verdict_ends_with_is_said_once() -> None:
    reasons = [
        "269/576 channels with s_c outside [0.5, 2] (median s_c 1.94); FX cannot equalize a Linear on 3-D inputs: not "
        "suggested",
        "323/576 channels with s_c outside [0.5, 2] (median s_c 2.10); FX cannot equalize a Linear on 3-D inputs: not "
        "suggested",
    ]
    assert shared_tail(reasons) == "FX cannot equalize a Linear on 3-D inputs: not suggested"
    assert shared_tail(reasons[:1]) == "" and shared_tail(["a; b", "c; d"]) == ""
    assert shared_tail(["same", "same"]) == ""  # each reason keeps its first part


def test_a_report_with_a_plan_leads_with_its_verdict() -> None:
    # The answer first (what the plan reached for real, against the default), once; its tables at the end.
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    batches = [torch.randn(8, 16) for _ in range(4)]
    report = qinsight.diagnose(model, batches[:2])
    plan = qinsight.plan(model, batches[:2], batches[2:], report=report, goal="sqnr>=30")
    lines = qinsight.to_text(report.with_plan(plan)).splitlines()
    verdict = lines.index(
        next(line for line in lines if line.startswith("Plan (fx, backend x86): target sqnr>=30 reached"))
    )
    first_detector = lines.index(next(line for line in lines if line.startswith("qinsight.per_channel")))
    assert verdict == 2 < first_detector
    assert sum(line.startswith("Plan (") for line in lines) == 1
    assert lines.index(next(line for line in lines if line.startswith("Sensitivity, costliest first"))) > first_detector
