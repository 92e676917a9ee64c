"""Data parts: Arrow tables of updates, encoded as Parquet (blob) or as one
Arrow IPC record-batch message (inline), and their consolidation.

An update table has the shard's schema: the user's ``key`` and ``val``
columns, then ``ts: uint64`` and ``diff: int64``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

from . import values as V
from .errors import CorruptState
from .state import BlobPart, InlinePart, KeyBound, Part

COLUMNS = ("key", "val", "ts", "diff")
#: Up to this many rows a table is small: Python's loops over its values
#: cost less than Arrow's calls (consolidation's and the ts check's looks).
SMALL_ROWS = 64
#: The largest Arrow IPC message an inline part holds, decompressed: larger
#: tables are never inlined, so decoding a part never allocates more.
INLINE_MESSAGE_MAX = 16 << 20
DEFAULT_SCHEMA = pa.schema([("key", pa.int64()), ("val", pa.string())])
#: The order of every part's rows, as Materialize persist keeps its parts': by
#: key, then val, then ts (nulls last). A file's ``sorting_columns`` say so.
UPDATE_ORDER = [("key", "ascending"), ("val", "ascending"), ("ts", "ascending")]
#: Parquet pages and dictionaries of at most 128 KiB instead of pyarrow's
#: 1 MiB: a reader decoding a part a chunk at a time holds one page and one
#: dictionary of each column, and a dictionary of keys (all distinct) only
#: grows the file before Parquet falls back to plain encoding. Measured by
#: ``shardsink bench parts`` (docs/benchmarks.md, Sorted parts).
WRITE_OPTIONS = {"data_page_size": 128 << 10, "dictionary_pagesize_limit": 128 << 10}
_TIME_FIELDS = (pa.field("ts", pa.uint64()), pa.field("diff", pa.int64()))
#: zstd level of inline parts: on a 4x8 trickle's 4- to 128-row parts, level 6
#: is 8-20% smaller than level 1 for 22-105 us a part; level 9 gains 0-6% more
#: for up to three times that.
ZSTD_LEVEL = 6
#: this thread's kept zstd contexts (a ``ZstdCompressor`` or
#: ``ZstdDecompressor`` is not thread-safe)
_contexts = threading.local()


def full_schema(schema: pa.Schema | None = None) -> pa.Schema:
    """The shard schema for ``schema``: either the ``key``/``val`` fields (the
    time and diff fields are added) or all four. ``None`` means key int64, val
    string. ``ValueError`` for anything else."""
    schema = DEFAULT_SCHEMA if schema is None else schema
    if not isinstance(schema, pa.Schema):
        raise ValueError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    if tuple(schema.names) == ("key", "val"):
        schema = pa.schema([*schema, *_TIME_FIELDS])
    if tuple(schema.names) != COLUMNS or not all(
        schema.field(f.name).type == f.type for f in _TIME_FIELDS
    ):
        raise ValueError(
            f"schema must have fields key, val (any types), optionally followed by "
            f"ts: uint64 and diff: int64; got {schema}"
        )
    return schema.remove_metadata()


def schema_to_bytes(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def schema_from_bytes(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns key, val, ts, diff cast to ``schema``; ``ValueError``
    naming the column that is missing or does not cast."""
    if not isinstance(table, pa.Table | pa.RecordBatch):
        raise ValueError(f"updates must be a pyarrow.Table, got {type(table).__name__}")
    if isinstance(table, pa.Table) and table.schema.equals(schema):
        return table  # a small append's casts were most of its 27 us here
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            raise ValueError(
                f"updates lack column {field.name!r}; expected columns {list(COLUMNS)}"
            )
        column = table.column(field.name)
        try:
            columns.append(column if column.type == field.type else column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ValueError(
                f"column {field.name!r} of type {column.type} does not cast to {field.type}: {exc}"
            ) from None
    return pa.Table.from_arrays(columns, schema=schema)


def empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def concat(tables: Iterable[pa.Table], schema: pa.Schema) -> pa.Table:
    tables = list(tables)
    return pa.concat_tables(tables) if tables else empty(schema)


def consolidate(table: pa.Table) -> pa.Table:
    """Sum the diffs of equal ``(key, val, ts)``, drop zero sums, sort in
    update order; ``table`` itself if it is consolidated already. Equality
    and order are :mod:`.values`': any type, nulls and nested values
    included (each group keeps its first row's value)."""
    if table.num_rows == 0 or _consolidated_already(table):
        return table
    return _grouped(table)


def _grouped(table: pa.Table) -> pa.Table:
    """:func:`consolidate` by Arrow's grouping and sort: of the columns
    themselves when key and val are plain, else of their
    :func:`~.values.order_columns`, taking each group's first row."""
    schema = table.schema
    if not V.encoded(schema):
        summed = table.group_by(["key", "val", "ts"], use_threads=False).aggregate(
            [("diff", "sum")]
        )
        summed = summed.filter(pc.not_equal(summed["diff_sum"], 0))
        out = pa.Table.from_arrays(
            [summed["key"], summed["val"], summed["ts"], summed["diff_sum"]], schema=schema
        )
        return out.sort_by(UPDATE_ORDER)
    names = ["k", "v", "t"]
    flat = pa.table(
        [*V.order_columns(table), table["diff"], pa.array(range(table.num_rows), pa.int64())],
        names=[*names, "diff", "row"],
    )
    summed = flat.group_by(names, use_threads=False).aggregate([("diff", "sum"), ("row", "min")])
    summed = summed.filter(pc.not_equal(summed["diff_sum"], 0))
    order = pc.sort_indices(summed, sort_keys=[(n, "ascending") for n in names])
    out = table.take(pc.take(summed["row_min"], order))
    return out.set_column(
        schema.get_field_index("diff"), "diff", pc.take(summed["diff_sum"], order)
    )


def _consolidated_already(table: pa.Table) -> bool:
    """Whether ``table``'s rows are strictly in update order (so no two are
    alike) with no zero or null diff: consolidated already.

    Why look: a small append's rows and a hydrate's snapshot (ascending
    unique keys) come so. Up to :data:`SMALL_ROWS` rows whose key and val
    Python orders as Arrow does, the look is in Python (4 rows: 17 us
    against 131 for Arrow's grouping and sort, by hand, ``process_time``);
    above, Arrow compares neighbouring rows (:func:`in_update_order`, which
    stops at the key when keys ascend strictly), where grouping and sorting
    a hydrate's snapshot was more than half of a hydrating worker's samples
    (py-spy)."""
    if table.num_rows <= SMALL_ROWS and all(
        _python_ordered(table.schema.field(name).type) for name in ("key", "val")
    ):
        small = _small_consolidated_already(table)
        if small is not None:
            return small
    diff = table["diff"]
    if diff.null_count or pc.any(pc.equal(diff, 0)).as_py():
        return False
    return in_update_order(table, strict=True)


def _small_consolidated_already(table: pa.Table) -> bool | None:
    """:func:`_consolidated_already` in Python; ``None`` for a table with a
    null key, val or ts, which Python does not order."""
    diffs = table["diff"].to_pylist()
    if 0 in diffs or None in diffs:
        return False
    columns = (table[name].to_pylist() for name in ("key", "val", "ts"))
    rows = list(zip(*columns, strict=True))
    if any(value is None for row in rows for value in row):
        return None
    return all(a < b for a, b in itertools.pairwise(rows))


def _python_ordered(kind: pa.DataType) -> bool:
    """Whether Python orders ``kind``'s values as Arrow sorts them (UTF-8
    strings by code point, as Arrow by their bytes)."""
    return (
        pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def sort_updates(table: pa.Table) -> pa.Table:
    """``table``'s rows in update order: ``table`` itself if they already
    are (a consolidated table's are), else a sorted copy."""
    if in_update_order(table):
        return table
    if not V.encoded(table.schema):
        # Arrow sorts each chunk and merges them: one copy of the table, where
        # combining the chunks first would make two
        return table.sort_by(UPDATE_ORDER)
    columns = V.order_columns(table)
    names = ["k", "v", "t"]
    order = pc.sort_indices(
        pa.table(columns, names=names), sort_keys=[(n, "ascending") for n in names]
    )
    return table.take(order)


def in_update_order(table: pa.Table, *, strict: bool = False) -> bool:
    """Whether ``table``'s rows are in update order (``strict``: and no two
    alike in it): vectorized comparisons of neighbouring rows of its
    :func:`~.values.order_columns`, cheaper than a sort, which stop at the
    first column (key) in which every row is below the next. A null is
    above every value and equal to a null."""
    if table.num_rows < 2:
        return True
    columns = V.order_columns(table)
    if _unordered_at_a_seam(columns[0]):
        return False  # a builder's table: its workers' runs one after another
    before = after = None  # rows ordered so far by the columns compared / equal in them
    for i, column in enumerate(columns):
        last = i == len(columns) - 1
        a, b = column[:-1], column[1:]
        less = _less(a, b)
        if last and not strict:
            less = pc.or_(less, _equal(a, b))
        before = less if before is None else pc.or_(before, pc.and_(after, less))
        if last or pc.all(before).as_py():
            break
        equal = _equal(a, b)
        after = equal if after is None else pc.and_(after, equal)
    return pc.all(before).as_py()


def _less(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """``a < b`` row by row, a null above every value (never null itself)."""
    less = pc.fill_null(pc.less(a, b), False)
    if a.null_count or b.null_count:
        less = pc.or_(less, pc.and_(pc.is_valid(a), pc.is_null(b)))
    return less


def _equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """``a == b`` row by row, nulls equal to each other (never null itself)."""
    equal = pc.fill_null(pc.equal(a, b), False)
    if a.null_count or b.null_count:
        equal = pc.or_(equal, pc.and_(pc.is_null(a), pc.is_null(b)))
    return equal


def _unordered_at_a_seam(first: pa.ChunkedArray | pa.Array) -> bool:
    """Whether a chunk of ``first`` (the column update order compares
    first) starts below the value the chunk before it ends with: a few
    scalar comparisons, where the whole check is a pass."""
    if not isinstance(first, pa.ChunkedArray):
        return False
    seams = list(itertools.accumulate(len(c) for c in first.chunks))[:-1]
    return any(
        0 < at < len(first) and _less(first[at : at + 1], first[at - 1 : at])[0].as_py()
        for at in seams
    )


def with_ts(table: pa.Table, ts_values: pa.Array | pa.ChunkedArray) -> pa.Table:
    return table.set_column(table.schema.get_field_index("ts"), "ts", ts_values)


def forward(table: pa.Table, since: int) -> pa.Table:
    """Advance every ``ts`` below ``since`` to ``since``."""
    if since == 0 or table.num_rows == 0:
        return table
    return with_ts(table, pc.max_element_wise(table["ts"], pa.scalar(since, pa.uint64())))


def at_time(table: pa.Table, as_of: int) -> pa.Table:
    """The consolidated collection as of ``as_of``: updates with ``ts <= as_of``,
    each moved to ``ts = as_of``."""
    table = table.filter(pc.less_equal(table["ts"], pa.scalar(as_of, pa.uint64())))
    return consolidate(with_ts(table, pa.repeat(pa.scalar(as_of, pa.uint64()), table.num_rows)))


def in_times(table: pa.Table, lower: int, upper: int) -> pa.Table:
    """Rows with ``lower <= ts < upper``."""
    ts = table["ts"]
    mask = pc.and_(
        pc.greater_equal(ts, pa.scalar(lower, pa.uint64())),
        pc.less(ts, pa.scalar(upper, pa.uint64())),
    )
    return table.filter(mask)


def ts_outside(table: pa.Table, lower: int, upper: int) -> tuple[int, int | None]:
    """How many rows have ``ts`` outside ``[lower, upper)``, and one such ``ts``."""
    if table.num_rows == 0:
        return 0, None
    # the usual answer (none) from a min/max scan, without copying the table
    # (of a small table's in Python: 2 us for 4 rows against 40 for Arrow's)
    ts = table["ts"]
    if table.num_rows <= SMALL_ROWS and not ts.null_count:
        values = ts.to_pylist()
        lo, hi = min(values), max(values)
    else:
        lo, hi = (s.as_py() for s in pc.min_max(ts).values())
    if lower <= lo and hi < upper:
        return 0, None
    outside = table.num_rows - in_times(table, lower, upper).num_rows
    return outside, lo if lo < lower else hi


def split(table: pa.Table, target_bytes: int) -> list[pa.Table]:
    """``table`` cut into consecutive slices of about ``target_bytes`` (in
    memory) each; no slice for an empty table."""
    rows = table.num_rows
    if rows == 0:
        return []
    if table.get_total_buffer_size() <= target_bytes:  # nbytes' bound, 50 times as quick
        return [table]
    per_part = max(1, rows * target_bytes // max(1, table.nbytes))
    return [table.slice(start, per_part) for start in range(0, rows, per_part)]


def _bounds(table: pa.Table) -> dict:
    ts_lo, ts_hi, key_lo, key_hi = _small_bounds(table) or _arrow_bounds(table)
    return {
        "rows": table.num_rows,
        "ts_lo": ts_lo,
        "ts_hi": ts_hi,
        "key_lo": _bound(key_lo),
        "key_hi": _bound(key_hi),
    }


def _arrow_bounds(table: pa.Table) -> tuple:
    """The bounds of ``table``'s ts and keys; no key bounds (``None``) for
    keys with a null or a NaN, which key ranges cannot place (a null or a NaN
    sorts after every value and compares to none), or of a type
    ``min_max`` does not take."""
    ts_lo, ts_hi = (s.as_py() for s in pc.min_max(table["ts"]).values())
    keys = table["key"]
    if keys.null_count or (pa.types.is_floating(keys.type) and pc.any(pc.is_nan(keys)).as_py()):
        return ts_lo, ts_hi, None, None
    try:
        key_lo, key_hi = (s.as_py() for s in pc.min_max(keys).values())
    except pa.ArrowNotImplementedError:
        key_lo = key_hi = None
    return ts_lo, ts_hi, key_lo, key_hi


def _small_bounds(table: pa.Table) -> tuple | None:
    """:func:`_arrow_bounds` in Python for a table of :data:`SMALL_ROWS` at
    most whose keys Python orders as Arrow does, without nulls (else
    ``None``): two ``min_max`` calls were 14 of a 4-row inline part's 55 us."""
    if table.num_rows > SMALL_ROWS or not _python_ordered(table.schema.field("key").type):
        return None
    ts, keys = table["ts"].to_pylist(), table["key"].to_pylist()
    if None in ts or None in keys:
        return None
    return min(ts), max(ts), min(keys), max(keys)


def _bound(value: object) -> KeyBound:
    return value if isinstance(value, int | float | str) and not isinstance(value, bool) else None


def inline_part(table: pa.Table, max_bytes: int, *, ordered: bool = False) -> InlinePart | None:
    """``table`` (non-empty) as an inline part: its Arrow IPC record-batch
    message of the rows in :data:`UPDATE_ORDER`, compressed as a whole with
    zstd; ``None`` if that is not below ``max_bytes``. (An inline table is a
    few thousand rows at most: sorting it costs microseconds, and a reader
    checks the order, as the part has no file to say so.) ``ordered``: the
    caller's word that the rows are in that order (a consolidated table's
    are), so they are not checked here: for the 4 rows of a small append the
    check cost 73 us, half of this function (by hand, ``process_time``).

    The whole message is compressed, not only its body (Arrow IPC's own body
    compression, ``IpcWriteOptions(compression=...)``): the message's
    metadata (about 300 bytes for four columns, mostly zeros) is most of a
    small part, and body compression leaves it as it is. For the 4, 32 and 128
    rows of a 4x8 trickle's parts: 552, 2,232 and 7,992 bytes uncompressed;
    528, 752 and 1,136 with zstd body compression (lz4: 560, 992, 2,264); 159,
    335 and 868 compressed whole. The zstd frame's own overhead is about ten
    bytes, always less than what the metadata gives up, so a part is never
    stored uncompressed (codec ``"none"`` is what earlier versions stored)."""
    too_big = table.get_total_buffer_size() >= 4 * max_bytes and table.nbytes >= 4 * max_bytes
    if max_bytes <= 0 or too_big:
        return None
    if not ordered:
        table = sort_updates(table)
    message = table.combine_chunks().to_batches()[0].serialize()
    if message.size > INLINE_MESSAGE_MAX:
        return None
    data = _zstd(message)
    if len(data) >= max_bytes:
        return None
    return InlinePart(data=data, codec="zstd", size=message.size, **_bounds(table))


def blob_part(table: pa.Table, key: str) -> tuple[BlobPart, bytes]:
    """``table`` (non-empty) encoded as Parquet with its rows in
    :data:`UPDATE_ORDER` (sorted first unless they are), and its part
    description under ``key``. The file says so (Parquet's
    ``sorting_columns``: key, val, ts), so a reader streams it a chunk at a
    time instead of loading and sorting it whole (see
    :func:`~.windows.part_chunks`)."""
    sink = pa.BufferOutputStream()
    table = sort_updates(table)
    pq.write_table(table, sink, sorting_columns=_in_order(table.schema), **WRITE_OPTIONS)
    data = sink.getvalue().to_pybytes()
    return BlobPart(key=key, encoded_bytes=len(data), **_bounds(table)), data


def _in_order(schema: pa.Schema) -> list[pq.SortingColumn] | None:
    """Update order as Parquet's ``sorting_columns``, as far as Parquet can
    say it: its columns are leaves, and it orders numbers, strings and
    binary, so the columns up to the first nested one (a struct's or list's
    leaves are not its order); ``None`` for a nested key. Readers need only
    the first, key (:func:`sorted_by_key`)."""
    declared = []
    for leaf, (name, _) in enumerate(UPDATE_ORDER):
        kind = schema.field(name).type
        if not (V.plain(kind) or pa.types.is_floating(kind)):
            break
        declared.append(pq.SortingColumn(leaf))
    return declared or None


class SortedPartWriter:
    """One Parquet part written a table at a time (each a row group), from
    tables in :data:`UPDATE_ORDER` added in that order, as compaction makes
    them (consolidated windows of ascending key ranges); the file says it is
    sorted. What it holds is the encoding so far, not the Arrow data: Parquet
    is several times smaller. ``ValueError`` for a table out of order or one
    that does not follow the last. :meth:`close` (idempotent) drops it
    unfinished."""

    def __init__(self, schema: pa.Schema) -> None:
        self._sink = pa.BufferOutputStream()
        self._writer = pq.ParquetWriter(
            self._sink, schema, sorting_columns=_in_order(schema), **WRITE_OPTIONS
        )
        self._bounds: dict | None = None
        self._last: pa.Table | None = None  # the last row written, a copy

    @property
    def encoded_bytes(self) -> int:
        """The bytes written so far (the file's footer comes on top)."""
        return self._sink.tell()

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        bounds = _bounds(table)
        joint = table if self._last is None else pa.concat_tables([self._last, table.slice(0, 1)])
        if not in_update_order(table) or not in_update_order(joint):
            raise ValueError(
                "a sorted part's tables must be sorted by key, val, ts and come in key order"
            )
        self._writer.write_table(table)
        self._bounds = bounds if self._bounds is None else _joined(self._bounds, bounds)
        self._last = table.take([table.num_rows - 1])

    def finish(self, key: str) -> tuple[BlobPart, bytes]:
        """The part's description under ``key`` and its bytes; ``ValueError``
        if nothing was written."""
        if self._bounds is None:
            raise ValueError("a part needs rows")
        self._writer.close()
        data = self._sink.getvalue().to_pybytes()
        return BlobPart(key=key, encoded_bytes=len(data), **self._bounds), data

    def close(self) -> None:
        self._writer.close()


def _joined(first: dict, then: dict) -> dict:
    """The bounds of two tables' rows, ``then``'s keys after ``first``'s."""
    return {
        "rows": first["rows"] + then["rows"],
        "ts_lo": min(first["ts_lo"], then["ts_lo"]),
        "ts_hi": max(first["ts_hi"], then["ts_hi"]),
        "key_lo": first["key_lo"],
        "key_hi": then["key_hi"],
    }


def decode_inline(part: InlinePart, schema: pa.Schema) -> pa.Table:
    """The rows of ``part``. ``ValueError`` (callers name the part with
    :func:`describe`) unless its payload decompresses to exactly ``size`` bytes (codec zstd, at
    most :data:`INLINE_MESSAGE_MAX`), is one record batch of ``schema`` that
    passes Arrow's full validation, and holds ``part.rows`` rows."""
    try:
        if part.codec == "zstd":
            if not 0 < part.size <= INLINE_MESSAGE_MAX:
                raise ValueError(
                    f"its decompressed size {part.size} is not in [1, {INLINE_MESSAGE_MAX}]"
                )
            message = pa.py_buffer(_unzstd(part.data, part.size))
        else:
            message = pa.py_buffer(part.data)
        batch = pa.ipc.read_record_batch(pa.ipc.read_message(message), schema)
        batch.validate(full=True)
    except (ValueError, OSError, pa.ArrowException, zstandard.ZstdError) as exc:
        raise ValueError(f"corrupt payload: {exc}") from None
    if batch.num_rows != part.rows:
        raise ValueError(f"corrupt payload: it holds {batch.num_rows} rows")
    return pa.Table.from_batches([batch], schema=schema)


def corrupt(shard: str, part: Part, exc: Exception) -> CorruptState:
    """The error for ``part`` of ``shard`` that does not decode (``exc`` says why)."""
    return CorruptState(f"shard {shard!r}: {describe(part)}: {exc}")


def describe(part: Part) -> str:
    """A part for error messages: a blob part by its key, an inline part by
    its codec, rows and time and key bounds (it has no name)."""
    if isinstance(part, BlobPart):
        return f"part {part.key}"
    return (
        f"inline part ({part.codec}, {part.rows} rows, ts {part.ts_lo}..{part.ts_hi}, "
        f"keys {part.key_lo!r}..{part.key_hi!r})"
    )


def decode_parquet(data: bytes, schema: pa.Schema) -> pa.Table:
    """``ValueError`` if ``data`` is not a Parquet file of ``schema``."""
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"corrupt Parquet part: {exc}") from None
    if not table.schema.remove_metadata().equals(schema):
        raise ValueError(f"Parquet part has schema {table.schema}, the shard {schema}")
    return table.replace_schema_metadata(None)


def sorted_by_key(file: pq.ParquetFile) -> bool:
    """Whether a Parquet part says its rows are sorted by key: every row
    group's ``sorting_columns`` lead with key, ascending. Every part written
    since parts are sorted says key, val, ts (:func:`blob_part`,
    :class:`SortedPartWriter`); compaction's of earlier versions say key;
    builders' of earlier versions say nothing, and neither does a part whose
    columns Arrow cannot sort."""
    key = file.schema_arrow.get_field_index("key")
    meta = file.metadata
    return meta.num_row_groups > 0 and all(
        _leads_with(meta.row_group(i).sorting_columns, key) for i in range(meta.num_row_groups)
    )


def _leads_with(columns: tuple, index: int) -> bool:
    return bool(columns) and columns[0].column_index == index and not columns[0].descending


def _zstd(message: pa.Buffer) -> bytes:
    """``message`` as one zstd frame, by this thread's compressor. Why not pyarrow's
    ``Codec.compress``: it makes a compression context per call, 23 us for
    a 4-row part's 552 bytes against 8 with a kept one (by hand,
    ``thread_time``), a fifth of what a writer spent on a 4-row batch."""
    compressor = getattr(_contexts, "zstd", None)
    if compressor is None:
        compressor = _contexts.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return compressor.compress(message)


def _unzstd(data: bytes, size: int) -> bytes:
    """The ``size`` bytes zstd frame ``data`` holds, by this thread's
    decompressor; ``ValueError`` if it holds another size. Why not
    pyarrow's ``decompress``: it makes a context per call, 10.2 us for a
    4-row part against 2.2 with a kept one (by hand, ``thread_time``), and a
    server's merges decode every inline part once."""
    # a frame that says its size is decompressed into that much, whatever
    # max_output_size says: refuse a size other than the part's first, so
    # a damaged or hostile part never makes a large allocation
    declared = zstandard.frame_content_size(data)
    if declared not in (size, -1):
        raise ValueError(f"its zstd frame holds {declared} bytes, not {size}")
    decompressor = getattr(_contexts, "unzstd", None)
    if decompressor is None:
        decompressor = _contexts.unzstd = zstandard.ZstdDecompressor()
    message = decompressor.decompress(data, max_output_size=size)
    if len(message) != size:
        raise ValueError(f"it decompresses to {len(message)} bytes, not {size}")
    return message
