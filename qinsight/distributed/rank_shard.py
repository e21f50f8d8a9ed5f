"""This process's shard of the default process group (:class:`~qinsight.core.shards.Shard` says which batches)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch.distributed as dist

from qinsight.core.errors import InvalidParameterError
from qinsight.core.shards import Shard

T = TypeVar("T")


def current_shard(owner: str) -> Shard:
    """This process's shard of the default process group; ``owner`` is the function that needs it."""
    if not (dist.is_available() and dist.is_initialized()):
        raise InvalidParameterError(
            owner,
            "distributed",
            True,
            "an initialized process group (torchrun, or torch.distributed.init_process_group)",
        )
    return Shard(rank=dist.get_rank(), world_size=dist.get_world_size())


def shard(data: Iterable[T]) -> Iterator[T]:
    """This rank's batches of ``data``, for ``diagnose(..., distributed=True)``.

    Args:
        data: every rank's batches, in the same order on each.

    Returns:
        Batches ``rank``, ``rank + world_size``, ... of the current process group, lazily.

    Raises:
        InvalidParameterError: no process group is initialized.
    """
    return current_shard("shard").of(data)
