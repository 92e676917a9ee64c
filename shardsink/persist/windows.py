"""Streaming consolidation: a shard's snapshot as key-ordered windows.

The snapshot as of ``as_of`` sums the ``diff`` of each ``(key, val)`` over the
updates with ``ts <= as_of``, drops zero sums and sets ``ts = as_of``. Every
part records its key min/max, and its rows come sorted by key (every part
written since parts are sorted says so in its file and is decoded a chunk at
a time; an unsorted part of an earlier version is loaded whole and sorted:
:func:`part_chunks`), so the sweep in :func:`windows` never needs the whole
shard: it opens parts in order of their smallest key, cuts at most a share of
``window_rows`` rows into each part the window may span (every part that may
hold a key at or below the cut is open by then), consolidates the rows up to
the cut with Arrow's ``group_by`` and keeps the rest. Memory is bounded by a
window plus one chunk of each part it spans (plus each unsorted part whole),
not by the shard.

This is library code that runs in users' processes: it leaves the process's
allocators alone (no pool switched, no heap trimmed). A long-running server
chooses its allocators where it starts (see :mod:`shardsink._allocator`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import takewhile

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..storage import Blob
from . import parts as P
from .state import BlobPart, InlinePart, KeyBound, Part

#: Rows of one loaded part a window consolidates at most (plus rows of the
#: cut's own key): the group-by's working set.
WINDOW_ROWS = 128 * 1024

#: Rows a sorted Parquet part is decoded in at a time: what each part a
#: window spans holds beyond the window's own share of it.
CHUNK_ROWS = 16 * 1024

#: A blob part of at most this many encoded bytes is fetched whole with one
#: ``get`` (one GET on S3); a larger one is opened (``Blob.open_input``) and
#: read through the file, :data:`READ_BUFFER_BYTES` of a column at a time (on
#: S3: a HEAD, the footer, then ranged GETs per column and row group).
WHOLE_GET_BYTES = 1 << 20

#: Bytes of one column chunk a part opened through ``open_input`` reads from
#: the file at a time (Parquet's buffered stream), so neither a part's blob
#: nor a whole row group's column chunk (a 1M-row part is one row group) is
#: ever held encoded.
READ_BUFFER_BYTES = 1 << 20

#: Loads a part's rows as consecutive tables, together sorted by key; ``None``
#: if its blob is missing.
Loader = Callable[[Part], Iterable[pa.Table] | None]


class Missing(Exception):
    """A part's blob was missing; ``key`` names it. The sweep can resume from
    refreshed state after the last key it emitted."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def output_columns(schema: pa.Schema, columns: Sequence[str] | None) -> list[str]:
    """The columns a read returns: ``columns`` in their order (default: all).
    ``ValueError`` naming an unknown or repeated column, or an empty list."""
    if columns is None:
        return list(schema.names)
    columns = list(columns)
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise ValueError(
            f"unknown column(s) {', '.join(map(repr, unknown))}; the shard has "
            f"{', '.join(schema.names)}"
        )
    if not columns or len(set(columns)) != len(columns):
        raise ValueError(f"columns must be distinct and at least one, got {columns}")
    return columns


def readable(parts: Iterable[Part], as_of: int) -> list[Part]:
    """The parts holding some update at or before ``as_of``."""
    return [p for p in parts if p.ts_lo <= as_of]


def windows(
    parts: Iterable[Part],
    load: Loader,
    as_of: int,
    schema: pa.Schema,
    after: KeyBound = None,
    window_rows: int = WINDOW_ROWS,
) -> Iterator[tuple[pa.Table, KeyBound]]:
    """The snapshot as of ``as_of`` of ``parts`` with keys above ``after``
    (all keys if ``None``), as ``(table, cut)`` pairs in key order: ``table``
    (sorted by key, val) holds exactly the keys in ``(previous cut, cut]``.
    The windows are :func:`key_windows`' and raise as they do."""
    for table, cut in key_windows(parts, load, as_of, schema, after, window_rows):
        window = P.at_time(table, as_of)
        del table
        yield window, cut


def key_windows(
    parts: Iterable[Part],
    load: Loader,
    as_of: int,
    schema: pa.Schema,
    after: KeyBound = None,
    window_rows: int = WINDOW_ROWS,
) -> Iterator[tuple[pa.Table, KeyBound]]:
    """The updates of ``parts`` with ``ts <= as_of`` and keys above
    ``after`` (all keys if ``None``), unconsolidated, as ``(table, cut)``
    pairs in key order: ``table`` holds every such update with a key in
    ``(previous cut, cut]``, so it consolidates on its own. Parts are read a
    chunk at a time, and a cut falls at most ``window_rows`` rows into any
    part (further only for rows of the cut's own key), so a large part is
    taken a slice at a time.

    Parts without key bounds (key types without a MessagePack-native value)
    make one window of everything, with cut ``None``. Raises :class:`Missing`
    when ``load`` finds a part's blob gone (nothing of that window was
    yielded), ``ValueError`` naming a part whose rows are not sorted by key.
    """
    parts = [p for p in readable(parts, as_of) if _may_hold_after(p, after)]
    if any(p.key_lo is None or p.key_hi is None for p in parts):
        cursors = [_Cursor(p, load, as_of, after) for p in parts]
        tables = [t for t in (c.take(None) for c in cursors) if t is not None]
        yield P.concat(tables, schema), None
        return
    pending = deque(sorted(parts, key=lambda p: p.key_lo))
    loaded: list[_Cursor] = []
    while pending or loaded:
        if not loaded:
            loaded.append(_Cursor(pending.popleft(), load, as_of, after))
        # The window's rows are shared among the parts it may span, so parts
        # that all overlap (workers' batches of one interval, each holding
        # every Nth key) do not each bring a whole window.
        share = _share(window_rows, loaded, pending)
        cut = min(c.cut(share) for c in loaded)
        while pending and pending[0].key_lo <= cut:
            cursor = _Cursor(pending.popleft(), load, as_of, after)
            loaded.append(cursor)
            cut = min(cut, cursor.cut(share))
        taken = [t for t in (c.take(cut) for c in loaded) if t is not None]
        loaded = [c for c in loaded if not c.exhausted]
        yield P.concat(taken, schema), cut


def _share(window_rows: int, loaded: list[_Cursor], pending: deque[Part]) -> int:
    """Rows of the window for each part that may hold keys of it: the loaded
    ones and the pending ones starting below the loaded ones' largest key."""
    top = max(c.part.key_hi for c in loaded)
    overlapping = len(loaded) + sum(1 for _ in takewhile(lambda p: p.key_lo <= top, pending))
    return max(1, window_rows // overlapping)


def _may_hold_after(part: Part, after: KeyBound) -> bool:
    return after is None or part.key_hi is None or part.key_hi > after


class _Cursor:
    """A part's updates at or before the as-of with keys above ``after``,
    pulled chunk by chunk from its loader as the sweep needs them."""

    def __init__(self, part: Part, load: Loader, as_of: int, after: KeyBound) -> None:
        chunks = load(part)
        if chunks is None:
            raise Missing(part.key)
        self.part, self.as_of, self.after = part, as_of, after
        self.chunks = iter(chunks)
        self.buffer: pa.Table | None = None
        self.last: KeyBound = None
        self.done = False

    @property
    def exhausted(self) -> bool:
        return self.done and (self.buffer is None or self.buffer.num_rows == 0)

    def _pull(self) -> None:
        chunk = next(self.chunks, None)
        if chunk is None:
            self.done = True
            return
        if self.part.ts_hi > self.as_of:
            chunk = chunk.filter(pc.less_equal(chunk["ts"], pa.scalar(self.as_of, pa.uint64())))
        if self.after is not None:
            after = pa.scalar(self.after, chunk.schema.field("key").type)
            chunk = chunk.filter(pc.greater(chunk["key"], after))
        if chunk.num_rows == 0:
            return
        if self.part.key_lo is not None:  # a part without key bounds is never cut
            keys = chunk["key"]
            first = keys[0].as_py()
            if (self.last is not None and first < self.last) or (
                len(keys) > 1 and not pc.all(pc.less_equal(keys[:-1], keys[1:])).as_py()
            ):
                raise ValueError(f"{P.describe(self.part)} is not sorted by key")
            self.last = keys[-1].as_py()
        self.buffer = chunk if self.buffer is None else pa.concat_tables([self.buffer, chunk])

    def cut(self, window_rows: int) -> KeyBound:
        """The highest cut this part allows: its largest key, or the key
        ``window_rows`` rows in."""
        while not self.done and (self.buffer is None or self.buffer.num_rows <= window_rows):
            self._pull()
        if self.buffer is not None and self.buffer.num_rows > window_rows:
            return self.buffer["key"][window_rows - 1].as_py()
        return self.part.key_hi

    def take(self, cut: KeyBound) -> pa.Table | None:
        """Remove and return the rows with keys at or below ``cut`` (all of
        them if ``None``)."""
        while not self.done and (cut is None or self.last is None or self.last <= cut):
            self._pull()
        if self.buffer is None:
            return None
        n = (
            self.buffer.num_rows
            if cut is None
            else pc.sum(
                pc.less_equal(
                    self.buffer["key"], pa.scalar(cut, self.buffer.schema.field("key").type)
                )
            ).as_py()
            or 0
        )
        taken, self.buffer = self.buffer.slice(0, n), self.buffer.slice(n)
        return taken


def part_chunks(
    blob: Blob, shard: str, part: Part, schema: pa.Schema, rows: int
) -> Iterator[pa.Table] | None:
    """A loader (see :data:`Loader`): ``part``'s rows sorted by key in chunks
    of at most ``rows``; ``None`` if its blob is missing.

    A Parquet part that says it is sorted (:func:`~.parts.sorted_by_key`:
    every part written since parts are sorted, and compaction's of earlier
    versions) is decoded ``rows`` at a time as the sweep pulls them: through
    ``Blob.open_input`` (:data:`READ_BUFFER_BYTES` of a column at a time),
    or from one ``get`` when it is at most :data:`WHOLE_GET_BYTES`; the file
    is closed when the chunks are exhausted or dropped. Any other (a
    builder's of an earlier version, its workers' parts one after another)
    is loaded whole and sorted, so memory holds each such part whole: its
    decoded rows and their sorted copy. An inline part is decoded whole (it
    is small) and sorted unless its rows are in order.

    :class:`CorruptState` if it does not decode as ``schema``;
    :class:`Missing` if its blob goes while it is read (a store whose reads
    then fail, S3); ``StorageError`` as the store raises it."""
    if isinstance(part, InlinePart):
        try:
            table = P.decode_inline(part, schema)
        except ValueError as exc:
            raise P.corrupt(shard, part, exc) from None
        return _slices(P.sort_updates(table), rows)
    whole = part.encoded_bytes <= WHOLE_GET_BYTES
    if whole:
        data = blob.get(part.key)
        source = None if data is None else pa.BufferReader(data)
    else:
        source = blob.open_input(part.key)
    if source is None:
        return None
    try:
        # pyarrow pre-buffers a row group's column chunks by default: a 1M-row
        # part is one row group, so that is the whole part again
        file = pq.ParquetFile(
            source, buffer_size=0 if whole else READ_BUFFER_BYTES, pre_buffer=False
        )
        if not file.schema_arrow.remove_metadata().equals(schema):
            raise ValueError(f"Parquet part has schema {file.schema_arrow}, the shard {schema}")
        if P.sorted_by_key(file):
            return _batches_of(blob, file, source, schema, rows, shard, part)
        table = file.read().replace_schema_metadata(None).cast(schema)
    except (ValueError, OSError) as exc:
        source.close()
        raise _failed(blob, shard, part, exc) from None
    source.close()
    return _slices(P.sort_updates(table), rows)


def _slices(table: pa.Table, rows: int) -> Iterator[pa.Table]:
    return (table.slice(start, rows) for start in range(0, table.num_rows, rows))


def _batches_of(
    blob: Blob,
    file: pq.ParquetFile,
    source: pa.NativeFile,
    schema: pa.Schema,
    rows: int,
    shard: str,
    part: BlobPart,
) -> Iterator[pa.Table]:
    try:
        for batch in file.iter_batches(batch_size=rows):
            yield pa.Table.from_batches([batch.replace_schema_metadata(None)], schema=schema)
    except OSError as exc:  # pyarrow's ArrowInvalid is a ValueError, its I/O errors OSError
        raise _failed(blob, shard, part, exc) from None
    except ValueError as exc:
        raise P.corrupt(shard, part, exc) from None
    finally:
        source.close()


def _failed(blob: Blob, shard: str, part: BlobPart, exc: Exception) -> Exception:
    """What a part that failed to read raises: :class:`Missing` if its blob
    is gone (reads of a deleted S3 object fail), else :class:`CorruptState`
    naming it and ``exc``."""
    if isinstance(exc, OSError) and blob.stat(part.key) is None:
        return Missing(part.key)
    return P.corrupt(shard, part, exc)
