"""Accumulating float-vs-quantized error over batches: kept outputs, reusable buffers, chunked sums.

The comparison's hot path. Per layer and batch it keeps the quantized output
until the float forward reaches the layer (as integers in one reused block),
then sums |x|², |y|², |x - y|² and max |x - y| chunk by chunk from cache. Every
built-in metric follows from those sums (:class:`~qinsight.plugin.ErrorTotals`),
so memory is O(1) per layer whatever the number of batches.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from qinsight.compare.layers import dequantize
from qinsight.core.comparison import MetricValue
from qinsight.core.errors import ComparisonError
from qinsight.plugin.metric import ErrorTotals, Metric


class SplitOutput(NamedTuple):
    """A layer output as its integers and per-tensor qparams, or (``scale`` None) as the output itself."""

    values: torch.Tensor
    scale: float | None = None
    zero_point: int = 0

    def tensor(self) -> torch.Tensor:
        """The output as float; for integers bit-identical to ``Tensor.dequantize()``, which
        computes (q - zero_point) * scale in float32 too."""
        if self.scale is None:
            return dequantize(self.values).detach().float()
        return (self.values.float() - self.zero_point) * self.scale


_INTEGERS = {torch.quint8: torch.uint8, torch.qint8: torch.int8, torch.qint32: torch.int32}


def split_output(output: object) -> SplitOutput:
    """Splits a dense per-tensor quantized tensor into integers and qparams; keeps anything else whole.

    The integers are a view of the tensor's own storage: ``int_repr()`` copies, and
    measured 7 ms on a 10M-value activation, more than the comparison's arithmetic on it.
    """
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"expected a tensor output, got {type(output).__name__}")
    if not output.is_quantized or not _dense(output):
        return SplitOutput(output)
    integer = _INTEGERS.get(output.dtype)
    if integer is None or output.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return SplitOutput(output)
    values = torch.empty(0, dtype=integer).set_(
        output.untyped_storage(), output.storage_offset(), output.shape, output.stride()
    )
    return SplitOutput(values, output.q_scale(), output.q_zero_point())


class KeptOutputs:
    """Layer outputs of the current batch, waiting for the float forward to reach their layer.

    With ``copied``, outputs are copied into one block of buffers that is reused
    batch after batch, planned from what the previous batch kept (an output with
    no room yet is kept as it is). The quantized models' outputs wait through
    the whole float forward; keeping the models' own tensors alive that long, or
    lasting buffers scattered through the heap, made the allocator hand out
    fresh pages on every batch (page faults cost the comparison more than its
    arithmetic: measured 0.41 against 0.43-0.45 s per MobileNetV2 batch).
    """

    def __init__(self, *, copied: bool) -> None:
        self._copied = copied
        self._kept: dict[tuple[str, str], list[SplitOutput | None]] = {}
        self._buffers: dict[tuple[str, str, int], torch.Tensor] = {}
        self._wanted: dict[tuple[str, str, int], tuple[int, torch.dtype]] = {}
        self._short = False

    def new_batch(self) -> None:
        self._kept.clear()
        if self._short:
            self._plan()

    def keep(self, key: str, fqn: str, output: object) -> None:
        calls = self._kept.setdefault((key, fqn), [])
        raw = split_output(output)
        calls.append(self._copy((key, fqn, len(calls)), raw) if self._copied else raw)

    def mostly_channels_last(self) -> bool:
        """Whether most 4-D outputs kept this batch are laid out channels-last (as quantized convs write them)."""
        layouts = [
            kept.values.is_contiguous(memory_format=torch.channels_last) and not kept.values.is_contiguous()
            for calls in self._kept.values()
            for kept in calls
            if kept is not None and kept.values.dim() == 4
        ]
        return 2 * sum(layouts) > len(layouts)

    def take(self, key: str, fqn: str, call: int) -> SplitOutput | None:
        """Call ``call``'s output, valid until the next batch; None if the layer was not called that often."""
        calls = self._kept.get((key, fqn))
        if calls is None or call >= len(calls):
            return None
        kept, calls[call] = calls[call], None
        return kept

    def _copy(self, slot: tuple[str, str, int], raw: SplitOutput) -> SplitOutput:
        values = raw.values
        if values.is_quantized or not _dense(values):  # per-channel and strided outputs: kept as they are
            return raw
        numel, dtype = values.numel(), values.dtype
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype:
            self._wanted[slot] = (numel, dtype)  # room for it from the next batch on
            self._short = True
            return raw
        return raw._replace(values=buffer[:numel].as_strided(values.shape, values.stride()).copy_(values.detach()))

    def _plan(self) -> None:
        """One block holding a buffer for every slot kept so far."""
        wanted = {slot: (buffer.numel(), buffer.dtype) for slot, buffer in self._buffers.items()} | self._wanted
        nbytes = {slot: numel * dtype.itemsize for slot, (numel, dtype) in wanted.items()}
        aligned = {slot: -(-n // 64) * 64 for slot, n in nbytes.items()}
        self._buffers.clear()  # before the new block is allocated, so the old one can be reused
        block, offset = torch.empty(sum(aligned.values()), dtype=torch.uint8), 0
        for slot, (_numel, dtype) in wanted.items():
            self._buffers[slot] = block[offset : offset + nbytes[slot]].view(dtype)
            offset += aligned[slot]
        self._wanted.clear()
        self._short = False


class Scratch:
    """Reusable buffers: one for a float reference laid out anew, two of one chunk each.

    A fresh 40 MB tensor per layer and batch cost more in page faults than the
    arithmetic on it (15 ms of 37 on a MobileNetV2 activation).
    """

    def __init__(self, chunk: int | None = None) -> None:
        self.chunk = CHUNK if chunk is None else chunk
        self._reference = torch.empty(0)
        self.values = torch.empty(self.chunk)
        self.error = torch.empty(self.chunk)

    def laid_out_as(self, tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``tensor`` in ``like``'s memory layout: itself if it already is, else a copy in a reused buffer.

        Quantized convs give channels-last outputs and float ones NCHW. Laying the
        float reference out once costs less than two subtractions across layouts
        (2.5x slower than within one), one for the propagated and one for the local error.
        """
        if tensor.stride() == like.stride() or not _dense(like) or tensor.shape != like.shape:
            return tensor
        if self._reference.numel() < like.numel():
            self._reference = torch.empty(like.numel())
        return self._reference.as_strided(like.shape, like.stride()).copy_(tensor)


# Values per chunk: about 4 MB of float32 each for the values and the error, so the
# passes over a chunk run from cache. Measured on a 10M-value activation: 9.9 ms for
# all passes of both comparisons chunk by chunk, 22.9 ms tensor by tensor.
CHUNK = 2**20


def _dense(tensor: torch.Tensor) -> bool:
    return tensor.is_contiguous() or tensor.is_contiguous(memory_format=torch.channels_last)


class Reference:
    """A layer's float output for one batch, laid out as the quantized output is, and its energy."""

    def __init__(self, output: torch.Tensor, like: torch.Tensor, scratch: Scratch) -> None:
        self.tensor = scratch.laid_out_as(output.detach().float(), like)
        self.sq: torch.Tensor | None = None  # Σx² (float64, on the output's device), summed by the first comparison


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as 1-D in memory order: a view for contiguous and channels-last tensors."""
    if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last):
        return tensor.permute(0, 2, 3, 1).reshape(-1)
    return tensor.reshape(-1)


SUMS = ("ref_sq", "act_sq", "err_sq", "max_abs")  # what chunk_sums gives, in this order


def chunk_sums(reference: Reference, actual: SplitOutput, scratch: Scratch) -> torch.Tensor:
    """|x|², |y|², |x - y|² and max |x - y| (:data:`SUMS`, float64 on the outputs' device) for the
    reference x and the output y, one chunk at a time, read on the host by no one: on a GPU the
    comparison never waits for the device.

    ``y = (values - zero_point) * scale`` is never written out: the scale is
    applied inside the subtraction (``alpha``). |x|² is summed once per
    reference and kept on it. Both run flat in memory order when their layouts agree
    (reductions over a flat tensor are fast whatever the layout; aminmax over a
    channels-last 4-D tensor measured 30x slower).
    """
    x, y = reference.tensor, actual.values
    x, y = (_flat(x), _flat(y)) if x.stride() == y.stride() and _dense(y) else (x.reshape(-1), y.reshape(-1))
    integers = actual.scale is not None
    scale = actual.scale if actual.scale is not None else 1.0
    chunks = []  # per chunk: Σy², Σ(x - y)², min and max of x - y, and Σx² where not known yet
    step = scratch.chunk
    for start in range(0, y.numel(), step):
        x_part, y_part = x[start : start + step], y[start : start + step]
        if integers:  # q - zero_point in float32, exact below 2^24
            y_part = scratch.values[: y_part.numel()].copy_(y_part).sub_(actual.zero_point)
        error = torch.sub(x_part, y_part, alpha=scale, out=scratch.error[: y_part.numel()])
        # float32 BLAS dots: 2.3x faster than vector_norm, within 0.01 dB of float64 sums
        low, high = torch.aminmax(error)
        parts = [torch.dot(y_part, y_part), torch.dot(error, error), low, high]
        if reference.sq is None:
            parts.append(torch.dot(x_part, x_part))
        chunks.append(torch.stack(parts))
    if not chunks:
        return torch.zeros(len(SUMS), dtype=torch.float64, device=y.device)
    table = torch.stack(chunks).double()  # (chunks, 4 or 5)
    if reference.sq is None:
        reference.sq = table[:, 4].sum()
    table[:, 0].mul_(scale**2)  # Σy² of the integers, scaled once
    sums = table[:, :2].sum(dim=0)
    largest = torch.maximum(-table[:, 2].amin(), table[:, 3].amax()).clamp_min(0.0)
    return torch.cat((reference.sq.reshape(1), sums, largest.reshape(1)))


class ErrorSums:
    """A layer's sums over batches, from which each metric's value follows.

    Metrics with a batch-totals form are derived from the sums at the end; any
    other metric (a plugin's) is computed on each batch's whole tensors and
    averaged over batches.
    """

    def __init__(self, metrics: dict[str, Metric]) -> None:
        self._sums: torch.Tensor | None = None  # SUMS over the batches, float64 on the outputs' device
        self.count = 0
        self.batches = 0
        self.metrics = metrics
        self.per_batch = {name: metric for name, metric in metrics.items() if metric.from_totals is None}
        self.per_batch_sums = dict.fromkeys(self.per_batch, 0.0)
        self._absorbed = (0.0, 0.0, 0.0, 0.0)  # SUMS of other processes' batches (:meth:`absorb`)

    def clear(self) -> None:
        """Back to no batch (before any :meth:`absorb`)."""
        self._sums = None
        self.count = self.batches = 0
        self.per_batch_sums = dict.fromkeys(self.per_batch, 0.0)

    def add(self, reference: Reference, actual: SplitOutput, scratch: Scratch) -> None:
        """Adds one batch's output, compared with the float reference (on the device: nothing read here)."""
        values = actual.values if actual.scale is not None else actual.tensor()
        if values.shape != reference.tensor.shape:
            raise ComparisonError(
                f"the float output has shape {tuple(reference.tensor.shape)}, the quantized one {tuple(values.shape)}"
            )
        sums = chunk_sums(reference, actual._replace(values=values), scratch)
        if self._sums is None:
            self._sums = sums  # chunk_sums' own tensor: added to in place from here on
        else:  # three sums add, the largest error is the larger
            self._sums[:3] += sums[:3]
            torch.maximum(self._sums[3:], sums[3:], out=self._sums[3:])
        self.count += values.numel()
        self.batches += 1
        if self.per_batch:  # a plugin's metric computes on whole tensors, in its own way
            output = actual.tensor()
            for name, metric in self.per_batch.items():
                self.per_batch_sums[name] += metric.on_tensors(reference.tensor, output)

    def state(self) -> tuple[ErrorTotals, dict[str, float]]:
        """What another process needs to add these sums to its own (:meth:`absorb`)."""
        return self.totals(), dict(self.per_batch_sums)

    def absorb(self, state: tuple[ErrorTotals, dict[str, float]]) -> None:
        """Adds the sums of another process's batches (:meth:`state`)."""
        totals, per_batch_sums = state
        ref_sq, act_sq, err_sq, max_abs = self._absorbed
        self._absorbed = (
            ref_sq + totals.ref_sq,
            act_sq + totals.act_sq,
            err_sq + totals.err_sq,
            max(max_abs, totals.max_abs),
        )
        self.count += totals.count
        self.batches += totals.batches
        for name, value in per_batch_sums.items():
            self.per_batch_sums[name] += value

    def totals(self) -> ErrorTotals:
        """The sums over every batch, this process's and those absorbed: read on the host here, once."""
        own = self._sums.tolist() if self._sums is not None else [0.0, 0.0, 0.0, 0.0]
        sums = [a + b for a, b in zip(own[:3], self._absorbed[:3])]
        return ErrorTotals(
            ref_sq=sums[0],
            act_sq=sums[1],
            err_sq=sums[2],
            max_abs=max(own[3], self._absorbed[3]),
            count=self.count,
            batches=self.batches,
        )

    def values(self) -> tuple[MetricValue, ...]:
        totals = self.totals()
        return tuple(
            MetricValue(
                name=name,
                value=metric.from_totals(totals)
                if metric.from_totals is not None
                else self.per_batch_sums[name] / max(self.batches, 1),
                higher_is_better=metric.higher_is_better,
            )
            for name, metric in self.metrics.items()
        )
