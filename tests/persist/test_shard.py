"""The public shard API, on memory stores and on file + SQLite."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink.persist import (
    NotReadable,
    SchemaMismatch,
    Shard,
    ShardConfig,
    ShardNotFound,
    UpperMismatch,
    parts as P,
)
from shardsink.persist.state import BlobPart, InlinePart
from tests.helpers.persist import interval_rows, memory_stores, rows_of, updates


def open_(stores, **kw):
    blob, consensus = stores
    return Shard.open("s", blob=blob, consensus=consensus, **kw, create=True)


def test_append_and_snapshot_with_retractions(stores):
    with open_(stores) as shard:
        w = shard.writer()
        assert w.compare_and_append_table(interval_rows(0, range(3)), 0, 1) == 1
        w.compare_and_append_table(interval_rows(1, range(3, 6)), 1, 2)
        w.compare_and_append_table(interval_rows(2, range(3), diff=-1), 2, 3)
        r = shard.reader()
        snap = r.snapshot()
        assert rows_of(snap) == [(k, format(k, "032x"), 2, 1) for k in range(3, 6)]
        assert snap.schema.names == ["key", "val", "ts", "diff"]
        assert rows_of(r.snapshot(0)) == [(k, format(k, "032x"), 0, 1) for k in range(3)]
        assert (shard.upper, shard.since) == (3, 0)
    with open_(stores) as again:  # a second handle rebuilds the same state
        assert again.reader().snapshot().num_rows == 3 and again.upper == 3


def test_upper_mismatch_carries_actual_upper_and_discards_blobs(stores):
    config = ShardConfig(inline_max_bytes=0)
    with open_(stores, config=config) as shard:
        w = shard.writer()
        w.compare_and_append_table(interval_rows(0, [1]), 0, 1)
        with pytest.raises(UpperMismatch, match="actual upper 1") as info:
            w.compare_and_append_table(interval_rows(0, [2]), 0, 1)
        assert (info.value.expected, info.value.actual) == (0, 1)
        referenced = shard.state().referenced_keys()
        assert set(shard.blob.list("s/part/")) <= referenced


def test_rows_outside_interval_are_rejected(stores):
    with open_(stores) as shard:
        w = shard.writer()
        with pytest.raises(ValueError, match=r"1 of 2 rows have ts outside .*\[3, 4\).*ts=9"):
            w.batch(updates([(1, "a", 3, 1), (2, "b", 9, 1)]), 3, 4)
        with pytest.raises(ValueError, match="0 <= lower < upper"):
            w.batch(updates([]), 4, 4)
        b = w.batch(updates([(1, "a", 3, 1)]), 3, 4)
        with pytest.raises(ValueError, match="not the appended interval"):
            w.compare_and_append([b], 0, 1)


def test_empty_interval_advances_upper_and_stores_nothing(stores):
    with open_(stores) as shard:
        w = shard.writer()
        w.compare_and_append([], 0, 5)
        w.compare_and_append([w.batch(updates([]), 5, 6)], 5, 6)
        assert shard.upper == 6 and shard.state().batches == {}
        assert shard.reader().snapshot().num_rows == 0


def test_large_parts_go_to_blob_as_parquet_small_ones_inline(stores):
    with open_(stores) as shard:
        w = shard.writer()
        w.compare_and_append_table(interval_rows(0, range(2)), 0, 1)
        w.compare_and_append_table(interval_rows(1, range(2, 2000)), 1, 2)
        inline, big = shard.state().ordered_batches()
        assert isinstance(inline.parts[0], InlinePart)
        assert isinstance(big.parts[0], BlobPart)
        data = shard.blob.get(big.parts[0].key)
        assert pq.read_table(pa.BufferReader(data)).num_rows == 1998
        stats = shard.stats()
        assert (stats.inline_parts, stats.data_parts, stats.blob_puts) == (1, 1, 1)
        assert stats.blob_put_bytes == len(data) and stats.rows == 2000
        assert shard.reader().snapshot().num_rows == 2000


def test_inline_cap_flushes_to_blob_and_retries(stores):
    # room for about three of the six one-row parts
    cap = 3 * len(P.inline_part(interval_rows(0, [0]), 4096).data) + 10
    config = ShardConfig(inline_total_max_bytes=cap)
    with open_(stores, config=config) as shard:
        w = shard.writer()
        for i in range(6):
            w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
        state = shard.state()
        assert state.inline_bytes <= cap
        kinds = [type(b.parts[0]) for b in state.ordered_batches()]
        assert InlinePart in kinds and BlobPart in kinds
        assert shard.reader().snapshot().num_rows == 6


def test_custom_schema_and_schema_mismatch(stores):
    schema = pa.schema([("key", pa.string()), ("val", pa.float64())])
    with open_(stores, schema=schema) as shard:
        table = pa.table(
            {
                "key": ["x", "y"],
                "val": [1.5, 2.5],
                "ts": pa.array([0, 0], pa.uint64()),
                "diff": [1, 1],
            }
        )
        shard.writer().compare_and_append_table(table, 0, 1)
    with pytest.raises(SchemaMismatch, match="differs"):
        open_(stores, schema=pa.schema([("key", pa.int64()), ("val", pa.string())]))
    with open_(stores) as shard:  # schema=None: the stored one
        assert shard.reader().snapshot()["key"].to_pylist() == ["x", "y"]


def test_missing_shard_and_bad_arguments():
    blob, consensus = memory_stores()
    with pytest.raises(ShardNotFound, match="does not exist"):
        Shard.open("nope", blob=blob, consensus=consensus, create=False)
    with pytest.raises(ValueError, match=r"invalid address 'tcp://127\.0\.0\.1'"):
        Shard.open("s", blob=blob, consensus="tcp://127.0.0.1", create=True)
    with pytest.raises(ValueError, match="invalid shard name"):
        Shard.open("../x", blob=blob, consensus=consensus, create=True)


def test_opening_by_name_alone_never_creates_a_shard(stores):
    """A misspelt name fails naming the shards there are; a schema (or
    ``create=True``) is what makes a new shard."""
    blob, consensus = stores
    schema = pa.schema([("key", pa.string()), ("val", pa.int64())])
    with Shard.open("default", blob=blob, consensus=consensus, schema=schema):
        pass
    with pytest.raises(ShardNotFound, match=r"'defualt' does not exist.*did you mean 'default'"):
        Shard.open("defualt", blob=blob, consensus=consensus)
    with Shard.open("default", blob=blob, consensus=consensus) as shard:
        assert shard.schema.field("key").type == pa.string()
    with pytest.raises(ShardNotFound, match="defualt"):  # the first refusal created nothing
        Shard.open("defualt", blob=blob, consensus=consensus)


def test_snapshot_bounds(stores):
    with open_(stores) as shard:
        w = shard.writer()
        r = shard.reader()
        assert r.snapshot().num_rows == 0
        w.compare_and_append_table(interval_rows(0, [1]), 0, 1)
        w.compare_and_append_table(interval_rows(1, [2]), 1, 2)
        with pytest.raises(NotReadable, match="not below the upper 2"):
            r.snapshot(2)
        shard.advance_since(1)
        with pytest.raises(NotReadable, match="below the since 1"):
            r.snapshot(0)
        with pytest.raises(ValueError, match="must stay below the upper 2"):
            shard.advance_since(2)


def test_listen_yields_each_interval_in_order(stores):
    with open_(stores) as shard:
        w = shard.writer()
        r = shard.reader()
        w.compare_and_append_table(interval_rows(0, [1, 2]), 0, 1)
        w.compare_and_append([], 1, 3)
        w.compare_and_append_table(interval_rows(3, [1], diff=-1), 3, 4)
        events = list(r.listen(since=0, until=4))
        assert [(e.lower, e.upper) for e in events] == [(0, 1), (1, 3), (3, 4)]
        assert rows_of(events[2].updates) == [(1, format(1, "032x"), 3, -1)]
        assert [e.updates.num_rows for e in events] == [2, 0, 1]
        with pytest.raises(TimeoutError, match="did not pass 4"):
            next(r.listen(timeout=0.05))


def test_listen_frontier_must_be_above_a_nonzero_since(stores):
    with open_(stores) as shard:
        shard.writer().compare_and_append([], 0, 5)
        shard.advance_since(3)
        with pytest.raises(NotReadable, match="frontier 2"):
            next(shard.reader().listen(since=2))


def test_listen_sees_another_handles_appends(stores):
    with open_(stores) as reader_shard, open_(stores) as writer_shard:
        r = reader_shard.reader()
        listening = r.listen(since=0, until=2, timeout=10)
        writer_shard.writer().compare_and_append_table(interval_rows(0, [7]), 0, 2)
        (event,) = list(listening)
        assert (event.lower, event.upper, event.updates.num_rows) == (0, 2, 1)


def test_expired_reader_reregisters_on_its_next_read():
    now = [0]
    blob, consensus = memory_stores()
    with Shard.open(
        "s", blob=blob, consensus=consensus, clock=lambda: now[0], create=True
    ) as shard:
        r = shard.reader(lease_ms=10)
        now[0] = 100
        report = shard.collect_garbage()
        assert report.readers_expired == (r.reader_id,)
        assert r.snapshot().num_rows == 0
        assert r.reader_id in shard.state().readers


def test_close_is_idempotent_and_releases_handles():
    blob, consensus = memory_stores()
    shard = Shard.open("s", blob=blob, consensus=consensus, create=True)
    r, w = shard.reader(), shard.writer()
    r.close()
    r.close()
    shard.close()
    shard.close()
    w.close()
    with Shard.open("s", blob=blob, consensus=consensus, create=True) as again:
        state = again.state()
        assert state.readers == {} and state.writers == {}
