"""The command under ``torchrun``: one process per rank, one report, one line per error.

``torchrun --nproc-per-node N -m qinsight diagnose ...`` starts N copies of the
command with ``RANK`` and ``WORLD_SIZE`` set. Each joins a gloo process group
(the command runs models where their factory puts them; the exchange carries
only statistics), calibrates its shard, and the report of all shards is made
once. Only rank 0 prints and writes files; the other ranks' output goes nowhere, so an error on any
rank is one line, rank 0's: every
error after joining reaches rank 0 through an exchange (loading the model and
the data is checked by all ranks together before calibration starts).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Iterator

from qinsight.core.errors import UsageError
from qinsight.core.shards import Shard


def parse_shard(text: str | None) -> Shard | None:
    """``--shard I/N``: this run calibrates shard I of N (batches I, I + N, ...), for ``qinsight merge``."""
    if text is None:
        return None
    rank, _, size = text.partition("/")
    try:
        return Shard(rank=int(rank), world_size=int(size))
    except ValueError:
        raise UsageError(
            f"--shard must look like I/N with 0 <= I < N (0/4 is the first of four), not {text!r}"
        ) from None


def launched() -> Shard | None:
    """This process's rank in a ``torchrun`` launch; None when it runs alone."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return None
    return Shard(rank=int(os.environ["RANK"]), world_size=world_size)


@contextlib.contextmanager
def process_group(launch: Shard | None) -> Iterator[None]:
    """Joined to the process group for the block (nothing to join when alone); rank 0 alone speaks."""
    if launch is None:
        yield
        return
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if launch.rank != 0:
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    try:
        yield
        dist.barrier()  # no rank tears the group down while another still reads from it (gloo aborts)
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def checked_together(launch: Shard | None) -> Iterator[None]:
    """Every rank leaves the block fine, or every rank raises the first rank's error."""
    if launch is None:
        yield
        return
    from qinsight.distributed import Exchange, current_shard, sharing_failures

    exchange = Exchange(current_shard("qinsight"))
    with sharing_failures(exchange):
        yield
    exchange.gather(None)


def takes_shard(factory: Callable[..., object]) -> bool:
    """Whether a ``--data`` factory reads its own shard: it takes ``rank`` and ``world_size``."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "rank" in parameters and "world_size" in parameters


def batches(factory: Callable[..., object], part: Shard | None, *, whole: bool = False) -> object:
    """The batches of ``factory`` this rank calibrates on (``whole``: all of them).

    A factory taking ``rank`` and ``world_size`` returns that shard itself,
    batches ``rank, rank + world_size, ...`` of the data; any other factory's
    batches are strided here.
    """
    if part is None or whole:
        return factory(rank=0, world_size=1) if takes_shard(factory) else factory()
    if takes_shard(factory):
        return factory(rank=part.rank, world_size=part.world_size)
    data = factory()
    if not isinstance(data, Iterable):
        raise UsageError(f"--data gave {type(data).__name__}, not an iterable of batches")
    return part.of(data)
