"""Activation-sized buffers the observers reuse batch after batch, one per device, dtype and use."""

from __future__ import annotations

import torch


class Scratch:
    """One buffer per (device, dtype, slot), grown to the largest activation seen and reused.

    A fresh buffer per call cost more in page faults than the arithmetic on it (1.9 against
    0.5 ms per call on the benchmark encoder's Linear inputs). What is written into a buffer is
    reduced before the next use of its slot: no result of an observer points into one. Holds the
    largest activation observed, per slot, until the process ends.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, torch.dtype, str], torch.Tensor] = {}
        # the views handed out, kept: a batch of the same shape costs no op to get its buffer
        self._views: dict[tuple[torch.device, torch.dtype, str, torch.Size], torch.Tensor] = {}

    def shaped(self, like: torch.Tensor, slot: str) -> torch.Tensor:
        """A contiguous buffer shaped and typed like ``like``; its contents are left over from before."""
        view = self._views.get((like.device, like.dtype, slot, like.shape))
        if view is not None:
            return view
        key = (like.device, like.dtype, slot)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < like.numel():
            buffer = self._buffers[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
            self._views = {known: v for known, v in self._views.items() if known[:3] != key}  # views of the old buffer
        if len(self._views) >= MAX_VIEWS:  # batches of ever new shapes (sequences of every length)
            self._views.clear()
        view = self._views[(*key, like.shape)] = buffer[: like.numel()].view(like.shape)
        return view


MAX_VIEWS = 1024  # views kept for reuse; past it they are made anew

SCRATCH = Scratch()
