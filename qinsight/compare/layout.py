"""The memory layout the float model runs in while it is compared: the quantized models' own.

x86 quantized convs write channels-last outputs. Fed channels-last batches, the float model's
activations come out laid out alike, so no float reference is copied into the other layout before
its comparison and no local run's input is (:mod:`qinsight.compare.activations`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from qinsight.compare.accumulate import KeptOutputs
from qinsight.frontends import run_batch


class FloatLayout:
    """Channels-last where most of the quantized models' kept outputs are, chosen on the first batch.

    mkldnn's channels-last convs are faster too: MobileNetV2's float forward took 95 ms a batch
    against 130 (2 threads). If the float model cannot run that way on the first batch (``x.view``
    of its input), the batch is compared again in its own layout, and so are the next ones.
    """

    def __init__(self) -> None:
        self.channels_last: bool | None = None

    def run(self, float_model: nn.Module, batch: object, kept: KeptOutputs) -> bool:
        """Runs ``float_model`` on ``batch``; False where the first batch failed channels-last (run it again)."""
        first = self.channels_last is None
        if first:
            self.channels_last = kept.mostly_channels_last()
        if not self.channels_last:
            run_batch(float_model, batch)
            return True
        try:
            run_batch(float_model, as_channels_last(batch))
        except RuntimeError:
            if not first:
                raise
            self.channels_last = False
            return False
        return True


def as_channels_last(batch: object) -> object:
    """``batch`` with its 4-D floating tensors in channels-last memory order (the others as they are)."""
    if isinstance(batch, torch.Tensor):
        return (
            batch.contiguous(memory_format=torch.channels_last)
            if batch.dim() == 4 and batch.is_floating_point()
            else batch
        )
    if isinstance(batch, Mapping):
        return {name: as_channels_last(value) for name, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(as_channels_last(value) for value in batch)
    return batch
