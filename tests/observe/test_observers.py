"""ActivationObserver: torch's observer tests ported (PEER.md (b) 8-11), a differential
test against ModelReportObserver, and the cases torch gets wrong."""

from __future__ import annotations

import math
import pickle

import attrs
import pytest
import torch
from torch import nn
from torch.ao.quantization.fx._model_report.model_report_observer import ModelReportObserver

from qinsight.core.errors import ObserverError
from qinsight.core.sites import ObserverSpec
from qinsight.core.stats import DataCondition
from qinsight.observe import batch
from qinsight.observe.observers import ActivationObserver


def observer(axis: int = 1, per_channel: bool = True, moments: bool = False) -> ActivationObserver:
    return ActivationObserver(ObserverSpec(channel_axis=axis, per_channel=per_channel, moments=moments), "m:pre")


def test_zero_tensor_is_constant_not_an_error() -> None:
    # torch 8: all-zero input -> min = max = 0, average range 0, and the ratio raises.
    obs = observer()
    obs(torch.zeros(4, 3, 5))
    stats = obs.freeze()
    assert (stats.min, stats.max, stats.mean_batch_range) == (0.0, 0.0, 0.0)
    assert stats.condition is DataCondition.CONSTANT
    assert stats.constant_batches == 1
    assert stats.batch_to_epoch_ratio() is None


def test_single_batch_of_ones() -> None:
    # torch 9
    obs = observer()
    obs(torch.ones(1, 7))
    stats = obs.freeze()
    assert (stats.min, stats.max, stats.epoch_range) == (1.0, 1.0, 0.0)
    assert stats.batch_to_epoch_ratio() is None


def test_observer_after_relu_running_average_over_epochs() -> None:
    # torch 10: 10 epochs with reset, the average-range formula checked after every batch.
    torch.manual_seed(0)
    relu, obs = nn.ReLU(), observer(per_channel=False)
    for _epoch in range(10):
        obs.reset()
        ranges: list[float] = []
        for _ in range(6):
            x = relu(torch.randn(8, 5))
            obs(x)
            ranges.append(float(x.max() - x.min()))
            stats = obs.freeze()
            assert stats.mean_batch_range == pytest.approx(sum(ranges) / len(ranges), rel=1e-12)
            assert stats.batches == len(ranges)
        assert stats.min >= 0.0


@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 7), (2, 3, 4, 5), (2, 3, 2, 4, 5)])
def test_matches_torch_model_report_observer(shape: tuple[int, ...]) -> None:
    # torch 11 (2-5D inputs, several epochs and batches), as a differential test.
    g = torch.Generator().manual_seed(len(shape))
    ours, theirs = observer(axis=1), ModelReportObserver(ch_axis=1)
    for _epoch in range(3):
        ours.reset()
        theirs.reset_batch_and_epoch_values()
        for index in range(15):
            x = torch.randn(*shape, generator=g) * (1 + index % 4) + index % 3
            ours(x)
            theirs(x)
        stats = ours.freeze()
        assert stats.min == theirs.epoch_activation_min.item()
        assert stats.max == theirs.epoch_activation_max.item()
        assert stats.mean_batch_range == pytest.approx(theirs.average_batch_activation_range.item(), rel=1e-5)
        assert stats.batch_to_epoch_ratio() == pytest.approx(theirs.get_batch_to_epoch_ratio().item(), abs=1e-5)
        assert stats.channel_min == tuple(theirs.min_val.double().tolist())
        assert stats.channel_max == tuple(theirs.max_val.double().tolist())


def test_linear_inputs_use_the_feature_axis() -> None:
    # (batch, seq, features): channels are the last axis, whatever the sequence length.
    obs = observer(axis=-1)
    x = torch.arange(2 * 10 * 4, dtype=torch.float32).reshape(2, 10, 4)
    obs(x)
    stats = obs.freeze()
    assert stats.channel_min == tuple(float(v) for v in x.reshape(-1, 4).min(dim=0).values)
    assert stats.channel_max == tuple(float(v) for v in x.reshape(-1, 4).max(dim=0).values)
    assert len(stats.channel_min or ()) == 4


def test_memory_is_flat_in_the_number_of_batches() -> None:
    obs = observer(axis=1, moments=True)
    for _ in range(200):
        obs(torch.randn(4, 6, 3))
    # float64: the min and -max, per channel too, then batches, constant, span and the moments: nothing per batch
    assert obs.state_bytes() == (2 + 2 * 6 + 3 + 4) * 8


def test_state_after_10_and_100_batches_is_the_same_size() -> None:
    spec = ObserverSpec(
        channel_axis=1, per_channel=True, moments=True, percentiles=(0.5, 0.975), percentile_samples=256
    )
    obs = ActivationObserver(spec, "x")
    sizes = {}
    for seen in range(1, 101):
        obs(torch.randn(4, 6, 30, 30))  # 3,600 values per channel: sampled
        if seen in (10, 100):
            sizes[seen] = (obs.state_bytes(), len(pickle.dumps(obs.freeze())))
    # float64: per channel min, -max and per percentile three sums; the min, -max, and 3 + 4 (moments) sums
    assert sizes[10] == sizes[100] and sizes[10][0] == 8 * (6 * (2 + 2 * 3) + 2 + 3 + 4)


@pytest.mark.parametrize("per_channel_values", [3_000, 40_000])
def test_chunked_percentile_work_gives_the_unchunked_statistics(
    per_channel_values: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The percentile work runs over groups of channels so its scratch memory stays small;
    # how the channels are grouped must not change a single value.
    x = torch.randn(per_channel_values // 10, 10, 24) * torch.linspace(0.1, 3.0, 24)
    x[x < 0.2] = 0.0
    frozen = []
    for chunk in (2**40, 1_000, 1):
        monkeypatch.setattr(batch, "CHUNK_VALUES", {"cpu": chunk})
        spec = ObserverSpec(channel_axis=2, per_channel=True, percentiles=(0.3, 0.975), percentile_samples=16384)
        obs = ActivationObserver(spec, "x")
        for scale in (1.0, 2.0):
            obs(x * scale)
        frozen.append(obs.freeze())
    assert frozen[0] == frozen[1] == frozen[2]


@pytest.mark.parametrize("device", ["cpu", *(["cuda"] if torch.cuda.is_available() else [])])
def test_state_stays_on_the_model_device(device: str) -> None:
    spec = ObserverSpec(channel_axis=1, per_channel=True, moments=True, percentiles=(0.975,), percentile_samples=100)
    obs = ActivationObserver(spec, "x")
    x = torch.randn(8, 4, 30, device=device)
    obs(x)
    obs(x)
    assert obs.state is not None and obs.state.device == x.device
    stats = obs.freeze()  # only the frozen statistics leave the device, as plain numbers
    assert stats.batches == 2 and stats.channel_max == tuple(float(v) for v in x.amax(dim=(0, 2)).cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_reduced_and_double_precision_activations(dtype: torch.dtype) -> None:
    # LLMs run in bfloat16, which numpy has no type for: the selection falls back to torch there
    x = torch.randn(512, 64).to(dtype)
    spec = ObserverSpec(channel_axis=1, per_channel=True, percentiles=(0.975,))
    obs = ActivationObserver(spec, "x")
    obs(x)
    ratios = obs.freeze().percentiles[0].ratio_sum
    reference = torch.quantile(x.double(), 0.975, dim=0, interpolation="lower")  # exact in any of these dtypes
    expected = (x.double().amax(0) / reference).tolist()
    assert ratios == pytest.approx(expected, rel=1e-6)


def test_nonfinite_batches_are_counted_and_left_out() -> None:
    obs = observer(axis=1)
    good = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    obs(good)
    obs(torch.tensor([[float("nan"), 0.0], [1.0, 1.0]]))
    obs(torch.tensor([[float("inf"), 0.0], [1.0, 1.0]]))
    stats = obs.freeze()
    assert (stats.batches, stats.nonfinite_batches) == (1, 2)
    assert (stats.min, stats.max) == (-2.0, 3.0)
    assert stats.channel_max == (3.0, 0.5)


def test_a_nonfinite_batch_changes_no_statistic_of_any_kind() -> None:
    # The observers skip it on the device (no Python branch on its values): every sum, extremum,
    # percentile ratio and tail count must be what the finite batches alone give.
    spec = ObserverSpec(channel_axis=-1, per_channel=True, moments=True, percentiles=(0.9,), tails=True)
    finite = [torch.randn(64, 8, generator=torch.Generator().manual_seed(i)) * 10 for i in range(3)]
    poisoned = finite[0].clone()
    poisoned[5, 2] = float("nan")
    poisoned[7, 3] = float("inf")
    clean, mixed = ActivationObserver(spec, "x"), ActivationObserver(spec, "x")
    for x in finite:
        clean(x)
    for x in (finite[0], poisoned, finite[1], -poisoned, finite[2]):
        mixed(x)
    expected = clean.freeze()
    assert mixed.freeze() == attrs.evolve(expected, nonfinite_batches=2)
    assert expected.tails is not None and expected.tails.values == 3 * 64 and expected.moments is not None


def test_only_nonfinite_data_means_no_data() -> None:
    obs = observer()
    obs(torch.full((2, 3), float("nan")))
    assert obs.freeze().condition is DataCondition.NO_DATA


def test_channel_count_change_names_the_observer() -> None:
    obs = observer(axis=-1)
    obs(torch.randn(2, 4))
    with pytest.raises(ObserverError, match=r"m:pre.*3 channels.*had 4"):
        obs(torch.randn(2, 3))


def test_tensor_beyond_quantile_limit() -> None:
    # torch.quantile refuses inputs over 2**24 elements; range statistics must not.
    obs = observer(axis=1)
    x = torch.zeros(1, 1, 4097, 4097)
    x[0, 0, 7, 9] = 5.0
    obs(x)
    stats = obs.freeze()
    assert stats.max == 5.0 and stats.channel_max == (5.0,)


def test_integer_input_is_observed_as_float() -> None:
    obs = observer(axis=-1)
    obs(torch.tensor([[1, 5], [3, -2]]))
    assert obs.freeze().channel_min == (1.0, -2.0)


def test_moments_are_batch_means_and_variances() -> None:
    obs = observer(moments=True, per_channel=False)
    batches = [torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0, 5.0, 7.0])]
    for b in batches:
        obs(b)
    moments = obs.freeze().moments
    assert moments is not None
    means = [b.mean().item() for b in batches]
    variances = [b.var(correction=0).item() for b in batches]
    assert moments.count == 2
    assert moments.mean_sum == pytest.approx(sum(means))
    assert moments.var_sq_sum == pytest.approx(sum(v * v for v in variances))
    assert math.isfinite(moments.stationarity() or math.nan)
