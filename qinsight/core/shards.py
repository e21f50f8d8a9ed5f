"""Which batches a process runs: batch ``i`` of the data belongs to shard ``i % world_size``.

Striding, not blocks, so every shard starts at once whatever the data's
length, and batch ``i`` keeps its global index ``i`` however many shards there
are (the seeds of sampled statistics follow it). Torch-free: the command line
parses ``--shard I/N`` into one without loading torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

import attrs

from qinsight.core.errors import InvalidValueError

T = TypeVar("T")


@attrs.frozen
class Shard:
    """This process's part of the batches: a rank of a process group, or one part of a batch job."""

    rank: int = attrs.field(validator=attrs.validators.ge(0))
    world_size: int = attrs.field(validator=attrs.validators.ge(1))

    def __attrs_post_init__(self) -> None:
        if self.rank >= self.world_size:
            raise InvalidValueError(f"rank {self.rank} is not below the world size {self.world_size}")

    def batch_index(self, local: int) -> int:
        """The global index of this shard's ``local``-th batch."""
        return local * self.world_size + self.rank

    def of(self, data: Iterable[T]) -> Iterator[T]:
        """This shard's batches of ``data``, read lazily. The other shards' batches are still produced and
        skipped: a data factory that reads only its own shard saves that work."""
        return itertools.islice(data, self.rank, None, self.world_size)
