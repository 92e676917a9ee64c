"""Building batches from update tables and reading their parts back.

The blob I/O of data parts lives here (state I/O is the machine's). Parts go
to blob under their writer's prefix, ``<shard>/part/<writer>/<uuid>.parquet``
(:func:`~.state.part_prefix`); a part whose encoding is below the shard's
``inline_max_bytes`` stays inline in the batch.
"""

from __future__ import annotations

import logging

import msgspec
import pyarrow as pa

from .._random_ids import random_hex
from ..storage import Blob, StorageError
from . import parts as P
from .digest import Digest, written
from .state import Batch, BlobPart, InlinePart, Part, part_prefix
from .stats import ShardStats

log = logging.getLogger(__name__)


def part_key(shard: str, writer: str) -> str:
    """A fresh key for a part ``writer`` writes (under its prefix)."""
    return f"{part_prefix(shard, writer)}{random_hex()}.parquet"


def put_blob_part(
    blob: Blob, shard: str, writer: str, table: pa.Table, stats: ShardStats
) -> BlobPart:
    return _put(blob, *P.blob_part(table, part_key(shard, writer)), stats)


def _put(blob: Blob, part: BlobPart, data: bytes, stats: ShardStats) -> BlobPart:
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
    writer: str,
    inline_max_bytes: int,
    target_bytes: int,
    stats: ShardStats,
    content: Digest | None = None,
) -> Batch:
    """A batch ``[lower, upper)`` of ``table`` (shard schema, already
    consolidated) for ``writer`` to append, in parts of about
    ``target_bytes``; inline where small. Its digest is ``content``, if the
    caller has computed it, else ``table``'s."""
    parts = [
        _part(blob, shard, writer, piece, inline_max_bytes, stats)
        for piece in P.split(table, target_bytes)
    ]
    return Batch(
        id=random_hex(),
        lower=lower,
        upper=upper,
        parts=tuple(parts),
        rows=table.num_rows,
        digest=written(table) if content is None else content,
    )


def flush_inline(
    blob: Blob, shard: str, writer: str, batch: Batch, schema: pa.Schema, stats: ShardStats
) -> Batch:
    """``batch`` with each inline part written to blob instead (same id), as
    ``writer``'s; :class:`CorruptState` naming the shard and part if one
    does not decode."""
    if not batch.inline_bytes:
        return batch
    flushed = tuple(
        put_blob_part(blob, shard, writer, load_part(blob, shard, p, schema), stats)
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
        raise P.corrupt(shard, part, exc) from None


def _part(
    blob: Blob, shard: str, writer: str, table: pa.Table, inline_max_bytes: int, stats: ShardStats
) -> Part:
    """``table`` (consolidated, so in update order) as an inline part if it
    encodes small enough, else a blob part."""
    return P.inline_part(table, inline_max_bytes, ordered=True) or put_blob_part(
        blob, shard, writer, table, stats
    )


def check_interval(lower: int, upper: int) -> None:
    """``ValueError`` unless ``[lower, upper)`` can be a batch's interval."""
    if not 0 <= lower < upper:
        raise ValueError(f"batch interval [{lower}, {upper}) must satisfy 0 <= lower < upper")


def check_ts(table: pa.Table, shard: str, lower: int, upper: int) -> None:
    """``ValueError`` naming how many rows of ``table`` (and one example) have
    ``ts`` outside the batch interval ``[lower, upper)``."""
    outside, example = P.ts_outside(table, lower, upper)
    if outside:
        raise ValueError(
            f"shard {shard!r}: {outside} of {table.num_rows} rows have ts outside the "
            f"batch interval [{lower}, {upper}), e.g. ts={example}"
        )


def discard(blob: Blob, batches: list[Batch]) -> None:
    """Delete the blob parts of ``batches``, which must never have been appended
    (best effort, see :func:`delete_unreferenced`)."""
    delete_unreferenced(blob, [key for batch in batches for key in batch.blob_keys()])


def delete_unreferenced(blob: Blob, keys: list[str]) -> None:
    """Delete ``keys``, which no state references. Best effort: a key whose
    delete fails is logged and left to the leaked-blob sweep, so cleaning up
    after a failure never raises over it."""
    for key in keys:
        try:
            blob.delete(key)
        except StorageError as exc:
            log.warning("could not delete %s (the leaked-blob sweep will): %s", key, exc)


class BatchBuilder:
    """One batch ``[lower, upper)`` for ``writer`` to append, built from Arrow
    record batches added one at a time, as a shared batch builder needs.

    ``add`` keeps a running byte count, so adding is O(1) whatever was added
    before; once the count reaches ``target_bytes`` the batches held so far are
    written as one Parquet part and released. ``finish`` writes the rest (inline
    if its encoding is below ``inline_max_bytes``) and returns the
    :class:`Batch`. Added batches are written as they are, not re-consolidated,
    so the batch holds exactly the rows added, each part's sorted by key,
    val, ts (:func:`~.parts.blob_part`); each must have the shard's schema.
    ``abort`` deletes the parts written so far. Not thread-safe.

    ``since``: rows may also carry ``ts == since`` past ``upper``, as
    compaction's do once it has forwarded times below ``since`` to it.
    The batch's digest is that of the rows added (:func:`~.digest.digest`,
    computed as they are added) unless ``digests`` is false (a compaction
    gives its output the sum of its inputs' instead).
    """

    def __init__(
        self,
        blob: Blob,
        shard: str,
        writer: str,
        lower: int,
        upper: int,
        *,
        inline_max_bytes: int,
        target_bytes: int,
        stats: ShardStats,
        since: int = 0,
        digests: bool = True,
    ) -> None:
        check_interval(lower, upper)
        self.digests = digests
        self.digest: Digest | None = Digest()
        self.since = since
        self.blob = blob
        self.shard = shard
        self.writer = writer
        self.lower = lower
        self.upper = upper
        self.inline_max_bytes = inline_max_bytes
        self.target_bytes = target_bytes
        self.stats = stats
        self.rows = 0
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self._parts: list[Part] = []
        self._done = False

    @property
    def held_bytes(self) -> int:
        """In-memory bytes of the batches added and not yet written."""
        return self._held_bytes

    def add(self, batch: pa.RecordBatch, *, write: bool = False) -> bool:
        """Add ``batch``; return whether every batch added so far is now written
        (the caller may then release their memory): at ``target_bytes``, or
        now if ``write`` (the caller needs the memory back sooner).
        ``ValueError`` if the builder is finished or aborted, or, when a part
        is written, if a row's ts is outside ``[lower, upper)``."""
        self._check_open()
        if batch.num_rows == 0:
            return False
        self._hold(batch)
        if self._held_bytes < self.target_bytes and not write:
            return False
        self._parts.append(
            put_blob_part(self.blob, self.shard, self.writer, self._take(), self.stats)
        )
        return True

    def finish(self) -> Batch:
        """Write what is held and return the batch (no parts if no rows were added)."""
        self._check_open()
        if self._held:
            table = self._take()
            self._parts.append(
                _part(self.blob, self.shard, self.writer, table, self.inline_max_bytes, self.stats)
            )
        self._done = True
        return Batch(
            id=random_hex(),
            lower=self.lower,
            upper=self.upper,
            parts=tuple(self._parts),
            rows=self.rows,
            digest=self.digest if self.digests else None,
        )

    def abort(self) -> list[str]:
        """Drop what is held and delete the parts written so far; return their
        keys. Idempotent; after ``finish`` it deletes nothing (the batch owns them)."""
        if self._done:
            return []
        self._done = True
        self._held, self._held_bytes = [], 0
        keys = [p.key for p in self._parts if isinstance(p, BlobPart)]
        delete_unreferenced(self.blob, keys)
        return keys

    def _hold(self, batch: pa.RecordBatch) -> None:
        self._held.append(batch)
        self._held_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self.digests and self.digest is not None:
            more = written(batch)
            self.digest = None if more is None else self.digest + more

    def _take(self) -> pa.Table:
        table = pa.Table.from_batches(self._held)
        self._held, self._held_bytes = [], 0
        check_ts(table, self.shard, self.lower, max(self.upper, self.since + 1))
        return table

    def _check_open(self) -> None:
        if self._done:
            raise ValueError(
                f"batch builder [{self.lower}, {self.upper}) is already finished or aborted"
            )


class SortedBatchBuilder(BatchBuilder):
    """A :class:`BatchBuilder` for tables sorted by key and added in key order,
    as compaction makes them: past what could still go inline, the rows go
    straight into a streamed Parquet part (:class:`~.parts.SortedPartWriter`)
    cut once its encoding reaches ``target_bytes``. So it holds one part's
    encoding, not its Arrow data: a compaction writing 16 MiB parts held
    three times that while Arrow data waited for its part to fill."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._schema: pa.Schema | None = None
        self._stream: P.SortedPartWriter | None = None

    def add(self, batch: pa.RecordBatch, *, write: bool = False) -> bool:
        """Add ``batch``; return whether every batch added so far is written
        or streamed (``write`` is ignored: nothing waits that could be written)."""
        self._check_open()
        if batch.num_rows == 0:
            return False
        self._schema = batch.schema
        self._hold(batch)
        if self._stream is None and self._held_bytes < 4 * self.inline_max_bytes:
            return False  # may still go inline
        if self._stream is None:
            self._stream = P.SortedPartWriter(self._schema)
        self._stream.write(self._take())
        if self._stream.encoded_bytes >= self.target_bytes:
            self._put_stream()
        return True

    def finish(self) -> Batch:
        if self._stream is not None:
            if self._held:
                self._stream.write(self._take())
            self._put_stream()
        return super().finish()

    def abort(self) -> list[str]:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        return super().abort()

    def _put_stream(self) -> None:
        assert self._stream is not None
        part, data = self._stream.finish(part_key(self.shard, self.writer))
        self._stream = None
        self._parts.append(_put(self.blob, part, data, self.stats))
