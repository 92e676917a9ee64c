"""Compaction's output: key-sorted tables streamed into Parquet parts cut by
their encoded size (``SortedPartWriter``, ``SortedBatchBuilder``)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink.persist import parts as P
from shardsink.persist.batches import SortedBatchBuilder, load_part
from shardsink.persist.state import BlobPart, InlinePart, part_prefix
from shardsink.persist.stats import ShardStats
from shardsink.storage.memory import MemoryBlob
from shardsink.workloads import SCHEMA, Workload

#: interval 0 of trickle: keys 0..N-1 in order, all at ts 0
ROWS = Workload("trickle", rows_per_interval=40_000).updates(0)
#: the (compaction's) writer the builder writes as
WRITER = "merge.7"


def _windows(table: pa.Table, rows: int) -> list[pa.RecordBatch]:
    return [
        b for start in range(0, table.num_rows, rows) for b in table.slice(start, rows).to_batches()
    ]


def _builder(blob: MemoryBlob, stats: ShardStats, target: int) -> SortedBatchBuilder:
    return SortedBatchBuilder(
        blob, "s", WRITER, 0, 1000, inline_max_bytes=4096, target_bytes=target, stats=stats
    )


def test_parts_are_cut_by_their_encoding_and_hold_every_row_in_key_order():
    blob, stats = MemoryBlob(uuid.uuid4().hex), ShardStats()
    builder = _builder(blob, stats, target=100_000)
    for batch in _windows(ROWS, 2_000):
        builder.add(batch)
    batch = builder.finish()
    assert batch.rows == ROWS.num_rows and len(batch.parts) >= 3
    assert stats.blob_puts == len(batch.parts)
    blob_parts = [p for p in batch.parts if isinstance(p, BlobPart)]
    assert all(p.key.startswith(part_prefix("s", WRITER)) for p in blob_parts)
    assert sorted(blob.list("s/")) == sorted(p.key for p in blob_parts)
    # every part but the last reached the target within one window's encoding
    assert all(100_000 <= p.encoded_bytes < 200_000 for p in blob_parts[:-1])
    tables = [load_part(blob, "s", p, SCHEMA) for p in batch.parts]
    assert pa.concat_tables(tables).equals(ROWS)
    for part, table in zip(batch.parts, tables, strict=True):
        keys = table["key"].to_pylist()
        assert (part.rows, part.key_lo, part.key_hi) == (len(keys), keys[0], keys[-1])
        assert (part.ts_lo, part.ts_hi) == (0, 0)
    file = pq.ParquetFile(pa.BufferReader(blob.get(blob_parts[0].key)))
    assert P.sorted_by_key(file) and file.num_row_groups > 1  # a row group per window


def test_a_small_output_stays_inline():
    blob, stats = MemoryBlob(uuid.uuid4().hex), ShardStats()
    builder = _builder(blob, stats, target=1 << 20)
    for batch in _windows(ROWS.slice(0, 20), 5):
        builder.add(batch)
    batch = builder.finish()
    assert [type(p) for p in batch.parts] == [InlinePart] and stats.blob_puts == 0


def test_tables_out_of_key_order_are_refused_and_abort_deletes_what_was_written():
    blob, stats = MemoryBlob(uuid.uuid4().hex), ShardStats()
    builder = _builder(blob, stats, target=50_000)
    windows = _windows(ROWS, 2_000)
    for batch in windows[:10]:
        builder.add(batch)
    assert stats.blob_puts >= 1
    with pytest.raises(ValueError, match="key order"):
        builder.add(windows[0])
    written = sorted(blob.list("s/part/"))
    assert sorted(builder.abort()) == written and not list(blob.list("s/part/"))
