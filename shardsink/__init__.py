"""shardsink: a multi-process worker cluster that coalesces Arrow parts into a
durable, Arrow-native shard.

The public API is what ``__all__`` lists; everything else may change. The
subpackages (``shardsink.storage``, ``shardsink.persist``, ``shardsink.server``,
``shardsink.shm``, ``shardsink.cluster``, ``shardsink.chaos``) export their own,
more detailed APIs; ``shardsink.faults`` holds the named fault points and
the store wrappers. ``open_blob`` and ``open_consensus`` here are
``shardsink.faults``' (a store opened while ``blob.call`` or
``consensus.call`` is armed injects faults); ``shardsink.storage``'s never wrap.
"""

from .cluster import Cluster, ClusterConfig, ClusterError, ClusterStats, Workload
from .connect import open_shard
from .faults import open_blob, open_consensus
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
