"""Running qinsight over many processes with torch.distributed: which batches are whose, and the one exchange.

A distributed run is one process per rank of an initialized process group
(``torchrun``, or ``torch.distributed.init_process_group``). Each rank
calibrates or compares on its shard of the data; at the end the ranks
exchange their statistics or error sums once and every rank holds the result
of all the data. :mod:`.rank_shard` finds this rank's :class:`~qinsight.core.shards.Shard`;
:mod:`.exchange` is that exchange, failures included.
"""

from qinsight.core.shards import Shard
from qinsight.distributed.exchange import Exchange, sharing_failures
from qinsight.distributed.rank_shard import current_shard, shard

__all__ = ["Exchange", "Shard", "current_shard", "shard", "sharing_failures"]
