"""shardsink: a multi-process worker cluster that coalesces Arrow parts into a
durable, Arrow-native shard.

The public API is what ``__all__`` lists here, in ``shardsink.storage`` (for
backend authors) and in ``shardsink.testing`` (docs/api.md;
``tests/test_exports.py`` holds them to it); everything else is the
package's inside and may change. ``open_blob`` and ``open_consensus`` here
are ``shardsink.faults``' (a store opened while ``blob.call`` or
``consensus.call`` is armed injects faults); ``shardsink.storage``'s never wrap.
"""

import importlib

#: Where each public name lives. Loaded on first use (PEP 562): a process
#: that needs one floor (a consensus server, a worker forked from the
#: zygote) does not import the cluster, the CLI's libraries and every other
#: floor through this package's ``__init__``. The consensus process started
#: in 0.55-0.60 s importing them all (by hand, ``Cluster.start`` timed).
_PUBLIC = {
    "Cluster": "cluster", "ClusterConfig": "cluster", "ClusterError": "cluster",
    "ClusterStats": "cluster", "Workload": "cluster",
    "open_shard": "connect", "open_shards": "connect",
    "ShardSet": "persist.shards", "Transaction": "persist.shards",
    "TransactionMismatch": "persist.shards", "TransactionRefused": "persist.shards",
    "open_blob": "faults", "open_consensus": "faults",
    "ListenEvent": "persist", "NotReadable": "persist", "PartMissing": "persist",
    "PersistError": "persist", "Reader": "persist", "SchemaMismatch": "persist",
    "Shard": "persist", "ShardConfig": "persist", "ShardNotFound": "persist",
    "ShardStats": "persist", "UpperMismatch": "persist", "Writer": "persist",
    "ConsensusServer": "server",
    "Blob": "storage", "Committed": "storage", "Consensus": "storage",
    "DeterminateError": "storage", "IndeterminateError": "storage", "Mismatch": "storage",
    "StorageError": "storage", "VersionedData": "storage",
}  # fmt: skip


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'shardsink' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


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
    "ShardSet",
    "ShardStats",
    "StorageError",
    "Transaction",
    "TransactionMismatch",
    "TransactionRefused",
    "UpperMismatch",
    "VersionedData",
    "Workload",
    "Writer",
    "__version__",
    "open_blob",
    "open_consensus",
    "open_shard",
    "open_shards",
]
