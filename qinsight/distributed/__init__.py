"""Running qinsight over many processes with torch.distributed: which batches are whose, and the one exchange.

A distributed run is one process per rank of an initialized process group
(``torchrun``, or ``torch.distributed.init_process_group``). Each rank
calibrates or compares on its shard of the data; at the end the ranks
exchange their statistics or error sums once and every rank holds the result
of all the data. :mod:`.shards` says which batches belong to which rank;
:mod:`.exchange` is that exchange, failures included.
"""

from qinsight.distributed.exchange import Exchange, sharing_failures
from qinsight.distributed.shards import Shard, current_shard, shard

__all__ = ["Exchange", "Shard", "current_shard", "shard", "sharing_failures"]
