"""Building batches from update tables and reading their parts back.

The blob I/O of data parts lives here (state I/O is the machine's). Parts go
to blob under ``<shard>/part/<uuid>.parquet``; a part whose encoding is below
the shard's ``inline_max_bytes`` stays inline in the batch.
"""

from __future__ import annotations

import uuid

import msgspec
import pyarrow as pa

from ..storage.contracts import Blob
from . import parts as P
from .errors import CorruptState
from .state import Batch, BlobPart, InlinePart, Part
from .stats import ShardStats


def part_key(shard: str) -> str:
    return f"{shard}/part/{uuid.uuid4().hex}.parquet"


def put_blob_part(blob: Blob, shard: str, table: pa.Table, stats: ShardStats) -> BlobPart:
    part, data = P.blob_part(table, part_key(shard))
    blob.set(part.key, data)
    stats.blob_puts += 1
    stats.blob_put_bytes += len(data)
    return part


def build_batch(
    blob: Blob,
    shard: str,
    table: pa.Table,
    lower: int,
    upper: int,
    *,
    inline_max_bytes: int,
    target_bytes: int,
    stats: ShardStats,
) -> Batch:
    """A batch ``[lower, upper)`` of ``table`` (shard schema, already
    consolidated), in parts of about ``target_bytes``; inline where small."""
    parts: list[Part] = []
    for piece in P.split(table, target_bytes):
        inline = P.inline_part(piece, inline_max_bytes)
        parts.append(inline or put_blob_part(blob, shard, piece, stats))
    return Batch(
        id=uuid.uuid4().hex, lower=lower, upper=upper, parts=tuple(parts), rows=table.num_rows
    )


def flush_inline(
    blob: Blob, shard: str, batch: Batch, schema: pa.Schema, stats: ShardStats
) -> Batch:
    """``batch`` with each inline part written to blob instead (same id)."""
    if not batch.inline_bytes:
        return batch
    flushed = tuple(
        put_blob_part(blob, shard, P.decode_inline(p, schema), stats)
        if isinstance(p, InlinePart)
        else p
        for p in batch.parts
    )
    return msgspec.structs.replace(batch, parts=flushed)


def load_part(blob: Blob, shard: str, part: Part, schema: pa.Schema) -> pa.Table | None:
    """The updates of ``part``; ``None`` if its blob is missing;
    :class:`CorruptState` if it does not decode as ``schema``."""
    try:
        if isinstance(part, InlinePart):
            return P.decode_inline(part, schema)
        data = blob.get(part.key)
        return None if data is None else P.decode_parquet(data, schema)
    except ValueError as exc:
        where = part.key if isinstance(part, BlobPart) else "inline"
        raise CorruptState(f"shard {shard!r}: part {where}: {exc}") from None


def discard(blob: Blob, batches: list[Batch]) -> None:
    """Delete the blob parts of ``batches``, which must never have been appended."""
    for batch in batches:
        for key in batch.blob_keys():
            blob.delete(key)
