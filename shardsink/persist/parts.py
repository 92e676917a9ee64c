"""Data parts: Arrow tables of updates, encoded as Parquet (blob) or as one
Arrow IPC record-batch message (inline), and their consolidation.

An update table has the shard's schema: the user's ``key`` and ``val``
columns, then ``ts: uint64`` and ``diff: int64``.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .state import BlobPart, InlinePart, KeyBound

COLUMNS = ("key", "val", "ts", "diff")
DEFAULT_SCHEMA = pa.schema([("key", pa.int64()), ("val", pa.string())])
_TIME_FIELDS = (pa.field("ts", pa.uint64()), pa.field("diff", pa.int64()))


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
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            raise ValueError(
                f"updates lack column {field.name!r}; expected columns {list(COLUMNS)}"
            )
        column = table.column(field.name)
        try:
            columns.append(column.cast(field.type))
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
    """Sum the diffs of equal ``(key, val, ts)``, drop zero sums, sort by key,
    val, ts."""
    schema = table.schema
    if table.num_rows == 0:
        return table
    summed = table.group_by(["key", "val", "ts"], use_threads=False).aggregate([("diff", "sum")])
    summed = summed.filter(pc.not_equal(summed["diff_sum"], 0))
    out = pa.Table.from_arrays(
        [summed["key"], summed["val"], summed["ts"], summed["diff_sum"]], schema=schema
    )
    return out.sort_by([("key", "ascending"), ("val", "ascending"), ("ts", "ascending")])


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
    lo, hi = (s.as_py() for s in pc.min_max(table["ts"]).values())
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
    per_part = max(1, rows * target_bytes // max(1, table.nbytes))
    return [table.slice(start, per_part) for start in range(0, rows, per_part)]


def _bounds(table: pa.Table) -> dict:
    ts_lo, ts_hi = (s.as_py() for s in pc.min_max(table["ts"]).values())
    try:
        key_lo, key_hi = (s.as_py() for s in pc.min_max(table["key"]).values())
    except pa.ArrowNotImplementedError:
        key_lo = key_hi = None
    return {
        "rows": table.num_rows,
        "ts_lo": ts_lo,
        "ts_hi": ts_hi,
        "key_lo": _bound(key_lo),
        "key_hi": _bound(key_hi),
    }


def _bound(value: object) -> KeyBound:
    return value if isinstance(value, int | float | str) and not isinstance(value, bool) else None


def inline_part(table: pa.Table, max_bytes: int) -> InlinePart | None:
    """``table`` (non-empty) as an inline part, or ``None`` if its encoding is
    not below ``max_bytes``."""
    if max_bytes <= 0 or table.nbytes >= 4 * max_bytes:
        return None
    data = table.combine_chunks().to_batches()[0].serialize().to_pybytes()
    if len(data) >= max_bytes:
        return None
    return InlinePart(data=data, **_bounds(table))


def blob_part(table: pa.Table, key: str) -> tuple[BlobPart, bytes]:
    """``table`` (non-empty) encoded as Parquet, and its part description under
    ``key``. A table sorted by key says so in the file (Parquet's
    ``sorting_columns``), so a reader may stream it instead of sorting it."""
    sink = pa.BufferOutputStream()
    keys = table["key"]
    ordered = len(keys) < 2 or pc.all(pc.less_equal(keys[:-1], keys[1:])).as_py()
    sorting = [pq.SortingColumn(table.schema.get_field_index("key"))] if ordered else None
    pq.write_table(table, sink, sorting_columns=sorting)
    data = sink.getvalue().to_pybytes()
    return BlobPart(key=key, encoded_bytes=len(data), **_bounds(table)), data


def decode_inline(part: InlinePart, schema: pa.Schema) -> pa.Table:
    """``ValueError`` if the payload is not a record batch of ``schema``."""
    try:
        message = pa.ipc.read_message(pa.py_buffer(part.data))
        batch = pa.ipc.read_record_batch(message, schema)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"corrupt inline part: {exc}") from None
    return pa.Table.from_batches([batch], schema=schema)


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
    """Whether a Parquet part says its rows are sorted by key (see :func:`blob_part`)."""
    key = file.schema_arrow.get_field_index("key")
    meta = file.metadata
    return meta.num_row_groups > 0 and all(
        _leads_with(meta.row_group(i).sorting_columns, key) for i in range(meta.num_row_groups)
    )


def _leads_with(columns: tuple, index: int) -> bool:
    return bool(columns) and columns[0].column_index == index and not columns[0].descending
