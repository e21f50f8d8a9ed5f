"""The test tiers, the hypothesis profiles, the threads torch runs on, and the shared fixtures.

Two tiers (README):

- ``python -m pytest -q``: the fast tier, every test not marked ``slow``, hypothesis on its quick
  profile (a tenth of each test's examples). Unit and small-model tests: a few minutes.
- ``python -m pytest -q --whole``: everything but the extended tier: real weights (MobileNetV2,
  MiniLM, SmolLM2, the digits), plans on them, gloo ranks and torchrun, the browser, and hypothesis
  on its CI profile (every example each test asks for). CI runs this one.
- ``--whole --extended``: the extended tier too, tests marked ``extended(minutes)``: plans on real
  weights that alone take minutes on 2 cores (CI's 20 minutes cannot hold them); skipped otherwise,
  each skip saying how long it takes.

An explicit ``-m`` wins over both. The suite runs with the defaults a user gets: ``diagnose`` verifies
its config for real and the command prints its progress, unless a test that wants speed says
``verify=False`` (``--no-verify``, ``--quiet``) itself. The helpers live in ``_models.py``
(test models), ``_data.py`` (batches, sentences, photos), ``_real.py`` (real weights), ``_peers.py``
(torch's side), ``_checks.py`` and their siblings; importing
them changes nothing global: what is global (warnings aside, which pyproject.toml filters) is set here.
"""

from __future__ import annotations

import os

import pytest
import torch
from _models import MLP, ConvBnReluCNN, seeded
from hypothesis import HealthCheck, settings
from torch import nn

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("quick", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=10)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--whole", action="store_true", help="run the whole suite: the slow tier too, hypothesis on its CI profile"
    )
    parser.addoption(
        "--extended", action="store_true", help="with --whole: the extended tier too (plans that take minutes each)"
    )


def pytest_configure(config: pytest.Config) -> None:
    whole = bool(config.getoption("--whole", default=False))
    if not config.option.markexpr:
        config.option.markexpr = "" if whole else "not slow"
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if whole else "quick"))
    # the machines have 2 cores; with xdist, each worker gets its share
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // workers))


# The whole suite's longest tests outside the extended tier (seconds on 2 cores of an AVX2 CPU, two
# workers: about 160, 40, 65, 130). Each
# worker starts one of them at once (``--dist worksteal`` gives each worker a half of the collection,
# in order) instead of both being left to the end.
LONGEST = (
    "test_every_documented_command_runs_as_written[cli.md]",
    "test_a_lowered_xnnpack_plan_scores_the_program_executorch_runs",
    "test_the_xnnpack_reports_advice_holds_in_the_program_executorch_runs",
    "test_mobilenet_v2_fx_with_the_reports_mapping_beats_fxs_default_and_nears_pt2es",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The extended tier skipped unless asked for, saying how long each takes; the longest tests at the
    head of each half of the collection, alternately (the same order in every process, as xdist requires)."""
    if not config.getoption("--extended", default=False):
        for item in items:
            marker = item.get_closest_marker("extended")
            if marker is not None:
                minutes = marker.args[0] if marker.args else "several"
                item.add_marker(pytest.mark.skip(reason=f"{minutes} minutes on 2 cores: run with --whole --extended"))
    longest = sorted((item for item in items if item.name in LONGEST), key=lambda item: LONGEST.index(item.name))
    if not longest:
        return
    rest = [item for item in items if item.name not in LONGEST]
    first, second = longest[0::2], longest[1::2]
    half = max(len(items) // 2, len(first))
    items[:] = first + rest[: half - len(first)] + second + rest[half - len(first) :]


@pytest.fixture
def mlp() -> nn.Module:
    return seeded(MLP())


@pytest.fixture
def cnn() -> nn.Module:
    return seeded(ConvBnReluCNN())
