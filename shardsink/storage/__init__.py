"""Storage contracts (``Blob``, ``Consensus``) and their backends.

What ``__all__`` lists is public, for backend authors (docs/api.md); the
names re-exported as themselves (``NAME as NAME``) are the floor's door for
the floors above, not public.
"""

from .backend import open_blob, open_consensus
from .contracts import (
    Blob,
    BlobMeta,
    CasRequest,
    CasResult,
    Committed,
    Consensus,
    LeavesTempFiles as LeavesTempFiles,
    Mismatch,
    TempMeta as TempMeta,
    VersionedData,
    temp_files as temp_files,
)
from .errors import DeterminateError, IndeterminateError, StorageError
from .memory import MemoryBlob as MemoryBlob
from .uri import BLOB_ENV as BLOB_ENV, STORE_ENV as STORE_ENV, redact as redact

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
