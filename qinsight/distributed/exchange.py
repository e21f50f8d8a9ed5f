"""The one exchange of a distributed run, and failures that end every rank instead of hanging them.

Every rank joins one gather: with its payload, or with its failure. A rank
that fails (bad data, a model error, an observer error) still joins it,
carrying the error, so the others raise :class:`ShardError` naming that rank
instead of waiting in a collective forever. What only rank 0 computes (the
detectors' analysis, run once) reaches the others by one broadcast that also
carries rank 0's failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch.distributed as dist

from qinsight.core.errors import ShardError, describe
from qinsight.core.shards import Shard
from qinsight.distributed.rank_shard import current_shard

T = TypeVar("T")


class Exchange:
    """The exchange of one distributed run over the default process group."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self._joined = False

    @classmethod
    def of(cls, owner: str, distributed: bool) -> Exchange | None:
        """The exchange of a distributed call (``distributed=True``), None for a call in one process."""
        return cls(current_shard(owner)) if distributed else None

    def gather(self, payload: T) -> list[T]:
        """Every rank's payload, in rank order; :class:`ShardError` on every healthy rank if one failed."""
        self._joined = True
        gathered: list[Any] = [None] * self.shard.world_size
        dist.all_gather_object(gathered, (payload, None))
        failed = [(rank, failure) for rank, (_, failure) in enumerate(gathered) if failure is not None]
        if failed:
            raise ShardError(*failed[0])
        return [value for value, _ in gathered]

    def fail(self, exc: BaseException) -> None:
        """Join the gather with ``exc`` instead of a payload (once; later failures are past the gather)."""
        if self._joined:
            return
        self._joined = True
        dist.all_gather_object([None] * self.shard.world_size, (None, describe(exc)))

    def from_rank0(self, compute: Callable[[], T]) -> T:
        """``compute()`` on rank 0, its value (or :class:`ShardError` with its failure) on every rank."""
        message: list[Any] = [None]
        if self.shard.rank == 0:
            try:
                value = compute()
            except Exception as exc:
                dist.broadcast_object_list([(None, describe(exc))], src=0)
                raise
            dist.broadcast_object_list([(value, None)], src=0)
            return value
        dist.broadcast_object_list(message, src=0)
        value, failure = message[0]
        if failure is not None:
            raise ShardError(0, failure)
        return value


@contextlib.contextmanager
def sharing_failures(exchange: Exchange | None) -> Iterator[None]:
    """Inside the block, an error on this rank is sent to the exchange before it propagates."""
    try:
        yield
    except Exception as exc:
        if exchange is not None:
            exchange.fail(exc)
        raise
