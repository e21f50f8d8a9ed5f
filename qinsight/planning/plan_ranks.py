"""A plan over the ranks of a process group: each rank runs a share of the evaluation batches, and
every score is of all of them.

``plan(..., resources=Resources(shard="distributed"))`` is called on every rank with the same data. Each rank calibrates
on all the calibration batches (every config is calibrated alike, so every rank quantizes it alike)
and runs the evaluation and held-out batches of its :class:`~qinsight.core.shards.Shard` (batch ``i``
is rank ``i % world_size``'s). Where a score is taken, the ranks gather their outputs per batch, put
them back in the batches' order and score them as one process would, so every rank takes the same
decisions and the plan is one process's, whatever the ranks. What a rank holds of the evaluation data
(its values, the outputs a sweep keeps) is its share's. The gathers are the plan's only collectives:
every rank takes them in the same order because every decision between them follows the scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

from qinsight.core.errors import InvalidParameterError
from qinsight.core.shards import Shard
from qinsight.distributed import current_shard

T = TypeVar("T")


class Ranks:
    """The ranks a plan runs over (``shard``: this one's), or one process (``None``): every method is
    then the identity."""

    def __init__(self, shard: Shard | None = None) -> None:
        self.shard = shard

    @classmethod
    def of(cls, distributed: bool) -> Ranks:
        """The process group's ranks for a distributed plan (one error where none is initialized), else one process."""
        if not distributed:
            return cls()
        try:
            return cls(current_shard("plan"))
        except InvalidParameterError as exc:  # said of the resource the user set
            given = 'Resources(shard="distributed")'
            raise InvalidParameterError("plan", "resources", given, f"{exc.expected}, or shard=None") from None

    def share(self, batches: Sequence[T], argument: str) -> tuple[T, ...]:
        """This rank's batches of ``batches`` (``argument``'s): at least one each, else one error."""
        if self.shard is None:
            return tuple(batches)
        if len(batches) < self.shard.world_size:
            expected = f"at least one batch per rank ({self.shard.world_size})"
            raise InvalidParameterError("plan", argument, f"{len(batches)} batches", expected)
        return tuple(self.shard.of(batches))

    @property
    def gather(self) -> Callable[[list[Any]], list[Any]] | None:
        """:meth:`gathered`, where there are ranks to gather from (``None``: one process)."""
        return self.gathered if self.shard is not None else None

    def gathered(self, local: list[Any]) -> list[Any]:
        """Every rank's ``local`` values (one per batch of its share), in the batches' global order."""
        if self.shard is None:
            return local
        shares = self.each(local)
        size = self.shard.world_size
        return [shares[index % size][index // size] for index in range(sum(len(share) for share in shares))]

    def each(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order."""
        if self.shard is None:
            return [value]
        found: list[Any] = [None] * self.shard.world_size
        dist.all_gather_object(found, value)
        return found

    def all_agree(self, holds: bool) -> bool:
        """Whether ``holds`` on every rank: a choice each rank makes from its own share (whether a sweep's
        values fit the memory budget) that must be the same everywhere, for the ranks to gather alike."""
        return all(self.each(holds))

    def first(self, value: T) -> T:
        """Rank 0's ``value`` on every rank: a measurement (a time) each rank takes for itself, agreed."""
        return self.each(value)[0]


__all__ = ["Ranks"]
