"""Detector discovery through entry points, with fake distributions written to a temporary folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _data import gaussian_batches
from _models import MLP, seeded

import qinsight
from qinsight.core.errors import PluginLoadError
from qinsight.plugin.discovery import DEFAULT_IDS, installed_detectors, resolve_detectors
from qinsight.plugin.testing import write_distribution
from qinsight.types import FailureStage

from _plugin_sources import WIDTHS

BROKEN = {
    "acme.import_error": ("acme_import_error", "import not_a_module_anywhere\n", "acme_import_error:X"),
    "acme.not_a_class": ("acme_not_a_class", "X = 42\n", "acme_not_a_class:X"),
    "acme.old_api": (
        "acme_old_api",
        WIDTHS.replace('id = "acme.widths"', 'id = "acme.old_api"').replace("api_version = 1", "api_version = 0"),
        "acme_old_api:WidthDetector",
    ),
    "acme.wrong_id": ("acme_wrong_id", WIDTHS, "acme_wrong_id:WidthDetector"),
    "acme.explodes": (
        "acme_explodes",
        WIDTHS.replace('id = "acme.widths"', 'id = "acme.explodes"').replace(
            "return result_of", "raise RuntimeError('boom'); return result_of"
        ),
        "acme_explodes:WidthDetector",
    ),
}
EXPECTED = {
    "acme.import_error": "ModuleNotFoundError: No module named 'not_a_module_anywhere'",
    "acme.not_a_class": "the entry point gives int, not a detector class",
    "acme.old_api": "written for detector API version 0; this qinsight speaks version 1",
    "acme.wrong_id": "its id is 'acme.widths', but it is registered as 'acme.wrong_id'",
}


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = write_distribution(
        tmp_path / "good", "acme-widths", {"acme_widths": WIDTHS}, {"acme.widths": "acme_widths:WidthDetector"}
    )
    monkeypatch.syspath_prepend(str(root))
    broken_root = tmp_path / "broken"
    write_distribution(
        broken_root,
        "acme-broken",
        {module: source for module, source, _ in BROKEN.values()},
        {detector_id: target for detector_id, (_, _, target) in BROKEN.items()},
    )
    monkeypatch.syspath_prepend(str(broken_root))
    for module, _, _ in BROKEN.values():
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.delitem(sys.modules, "acme_widths", raising=False)
    monkeypatch.delenv("QINSIGHT_DETECTORS", raising=False)
    return tmp_path


def test_builtins_are_registered_as_entry_points() -> None:
    ids = {entry.id for entry in installed_detectors()}
    assert set(DEFAULT_IDS) <= ids
    entry = next(e for e in installed_detectors() if e.id == "qinsight.outliers")
    assert entry.distribution == "qinsight" and entry.target == "qinsight.detectors.outliers:OutlierDetector"


def test_discovery_imports_nothing(plugins: Path) -> None:
    ids = {entry.id for entry in installed_detectors()}
    assert {"acme.widths", *BROKEN} <= ids
    qinsight.diagnose(seeded(MLP()), gaussian_batches((4, 16), 2))
    assert not any(module in sys.modules for module, _, _ in BROKEN.values())
    assert "acme_widths" not in sys.modules


def test_plugin_detector_by_id(plugins: Path) -> None:
    report = qinsight.diagnose(
        seeded(MLP()), gaussian_batches((4, 16), 2), detectors=["acme.widths", "qinsight.outliers"]
    )
    widths = report.result("acme.widths")
    assert [(f.fqn, f.verdict) for f in widths.findings] == [("fc1", "narrow"), ("fc2", "wide"), ("fc3", "wide")]
    assert "  wide (2): fc2, fc3 -- 32 input features" in qinsight.to_text(report)
    assert not report.failures


@pytest.mark.parametrize("detector_id", sorted(EXPECTED))
def test_load_failures_are_recorded_and_others_stand(plugins: Path, detector_id: str) -> None:
    report = qinsight.diagnose(seeded(MLP()), gaussian_batches((4, 16), 2), detectors=[detector_id, "acme.widths"])
    (failure,) = report.failures
    assert (failure.detector, failure.stage) == (detector_id, FailureStage.LOAD)
    assert EXPECTED[detector_id] in failure.error
    assert len(report.result("acme.widths").findings) == 3
    with pytest.raises(PluginLoadError, match=detector_id):
        qinsight.diagnose(seeded(MLP()), gaussian_batches((4, 16), 2), detectors=[detector_id], strict=True)


def test_exception_during_analysis_is_recorded(plugins: Path) -> None:
    report = qinsight.diagnose(
        seeded(MLP()), gaussian_batches((4, 16), 2), detectors=["acme.explodes", "qinsight.per_channel"]
    )
    (failure,) = report.failures
    assert (failure.detector, failure.stage, failure.error) == (
        "acme.explodes",
        FailureStage.ANALYZE,
        "RuntimeError: boom",
    )
    assert len(report.result("qinsight.per_channel").findings) == 3


def test_unknown_id_is_a_load_failure() -> None:
    detectors, failures = resolve_detectors(["acme.nowhere"])
    assert detectors == () and failures[0].stage is FailureStage.LOAD
    assert "no such detector is installed" in failures[0].error


def test_environment_allowlist(plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QINSIGHT_DETECTORS", "qinsight.outliers, acme.widths")
    report = qinsight.diagnose(seeded(MLP()), gaussian_batches((4, 16), 2))
    assert [r.detector for r in report.results] == ["qinsight.outliers", "acme.widths"]


def test_backend_reaches_detectors_that_take_one() -> None:
    detectors, _ = resolve_detectors(["qinsight.per_channel"], backend="qnnpack")
    assert detectors[0] == qinsight.detectors.PerChannelDetector(backend="qnnpack")
    with pytest.raises(qinsight.errors.InvalidParameterError, match="backend='tpu'"):
        qinsight.diagnose(seeded(MLP()), [torch.randn(2, 16)], deploy=qinsight.types.Deployment(backend="tpu"))
