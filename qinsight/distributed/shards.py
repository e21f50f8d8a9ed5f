"""Which batches a rank calibrates on: batch ``i`` of the data belongs to rank ``i % world_size``.

Striding, not blocks, so every rank starts at once whatever the data's
length, and batch ``i`` keeps its global index ``i`` on any number of ranks
(the seeds of sampled statistics follow it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

import attrs
import torch.distributed as dist

from qinsight.core.errors import InvalidParameterError

T = TypeVar("T")


@attrs.frozen
class Shard:
    """This process's place in a distributed run."""

    rank: int = attrs.field(validator=attrs.validators.ge(0))
    world_size: int = attrs.field(validator=attrs.validators.ge(1))

    def __attrs_post_init__(self) -> None:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below the world size {self.world_size}")

    def batch_index(self, local: int) -> int:
        """The global index of this rank's ``local``-th batch."""
        return local * self.world_size + self.rank

    def of(self, data: Iterable[T]) -> Iterator[T]:
        """This rank's batches of ``data``, read lazily. The other ranks' batches are still produced and
        skipped: a data factory that reads only its own shard saves that work."""
        return itertools.islice(data, self.rank, None, self.world_size)


def current_shard(owner: str) -> Shard:
    """This process's shard of the default process group; ``owner`` is the function that needs it."""
    if not (dist.is_available() and dist.is_initialized()):
        raise InvalidParameterError(
            owner, "distributed", True, "an initialized process group (torchrun, or torch.distributed.init_process_group)"
        )
    return Shard(rank=dist.get_rank(), world_size=dist.get_world_size())


def shard(data: Iterable[T]) -> Iterator[T]:
    """This rank's batches of ``data``, for ``diagnose(..., distributed=True)``: batches ``rank``, ``rank + world_size``, ..."""
    return current_shard("shard").of(data)
