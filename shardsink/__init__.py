"""shardsink: a multi-process worker cluster that coalesces Arrow parts into a
durable, Arrow-native shard.

The public API is what ``__all__`` lists; everything else may change.
"""

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
    "Committed",
    "Consensus",
    "DeterminateError",
    "IndeterminateError",
    "Mismatch",
    "StorageError",
    "VersionedData",
    "__version__",
    "open_blob",
    "open_consensus",
]
