"""Storage contracts (``Blob``, ``Consensus``) and their backends."""

from .backend import open_blob, open_consensus
from .contracts import (
    Blob,
    BlobMeta,
    CasRequest,
    CasResult,
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
)
from .errors import DeterminateError, IndeterminateError, StorageError

__all__ = [
    "Blob",
    "BlobMeta",
    "CasRequest",
    "CasResult",
    "Committed",
    "Consensus",
    "DeterminateError",
    "IndeterminateError",
    "Mismatch",
    "StorageError",
    "VersionedData",
    "open_blob",
    "open_consensus",
]
