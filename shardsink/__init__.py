"""shardsink: a multi-process worker cluster that coalesces Arrow parts into a
durable, Arrow-native shard.

The public API is what ``__all__`` lists; everything else may change. The
subpackages (``shardsink.storage``, ``shardsink.persist``, ``shardsink.server``,
``shardsink.shm``, ``shardsink.cluster``, ``shardsink.chaos``) export their own,
more detailed APIs; ``shardsink.faults`` holds the named fault points.
"""

from .cluster import Cluster, ClusterConfig, ClusterError, ClusterStats, Workload
from .connect import open_shard
from .persist import (
    ListenEvent,
    NotReadable,
    PartMissing,
    PersistError,
    Reader,
    SchemaMismatch,
    Shard,
    ShardConfig,
    ShardNotFound,
    ShardStats,
    UpperMismatch,
    Writer,
)
from .server import ConsensusServer
from .storage import (
    Blob,
    Committed,
    Consensus,
    DeterminateError,
    IndeterminateError,
    Mismatch,
    StorageError,
    VersionedData,
    open_blob,
    open_consensus,
)

__version__ = "0.1.0"

__all__ = [
    "Blob",
    "Cluster",
    "ClusterConfig",
    "ClusterError",
    "ClusterStats",
    "Committed",
    "Consensus",
    "ConsensusServer",
    "DeterminateError",
    "IndeterminateError",
    "ListenEvent",
    "Mismatch",
    "NotReadable",
    "PartMissing",
    "PersistError",
    "Reader",
    "SchemaMismatch",
    "Shard",
    "ShardConfig",
    "ShardNotFound",
    "ShardStats",
    "StorageError",
    "UpperMismatch",
    "VersionedData",
    "Workload",
    "Writer",
    "__version__",
    "open_blob",
    "open_consensus",
    "open_shard",
]
