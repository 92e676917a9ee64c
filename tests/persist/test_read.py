"""Streaming reads: ``Reader.batches``, ``Shard.batches``, DuckDB and Polars,
and the key-range sweep of ``persist.windows``."""

from __future__ import annotations

import gc
import random
import threading

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink import open_shard
from shardsink.persist import parts as P, windows as W
from shardsink.persist.config import ShardConfig
from shardsink.persist.errors import NotReadable
from shardsink.persist.state import BlobPart
from shardsink.persist.stats import ShardStats
from shardsink.workloads import Workload
from tests.helpers.persist import SCHEMA, spine_pass, updates

CHURN = Workload("churn", rows_per_interval=300, interval_ms=10)
INTERVALS = 8
#: Small blob parts, so every interval's batch is several parts.
SPLIT = ShardConfig(inline_max_bytes=0, blob_target_bytes=4096)
#: A compactor that merges every batch of the shard into one run.
MERGE = ShardConfig(inline_max_bytes=0, blob_target_bytes=64 * 1024 * 1024)


def fill_churn(shard, intervals: int = INTERVALS) -> None:
    writer = shard.writer()
    for i in range(intervals):
        t = i * CHURN.interval_ms
        writer.compare_and_append_table(CHURN.updates(i), t, t + CHURN.interval_ms)


@pytest.fixture
def churn(stores):
    blob, consensus = stores
    with open_shard("s", blob=blob, consensus=consensus, config=SPLIT, create=True) as shard:
        fill_churn(shard)
        yield shard


def test_batches_equal_the_churn_collection_before_and_after_compaction(churn, stores):
    expected = CHURN.expected(INTERVALS)
    assert len(churn.state().ordered_batches()[-1].parts) > 1
    stream = churn.batches(max_rows=100)
    sizes = [b.num_rows for b in stream]
    assert max(sizes) <= 100 and sum(sizes) == expected.num_rows
    assert churn.batches().read_all().equals(expected)
    blob, consensus = stores
    with open_shard("s", blob=blob, consensus=consensus, config=MERGE, create=True) as other:
        assert other.compact().applied >= 1
        other.collect_garbage()
    assert len(churn.state().batches) < INTERVALS
    assert churn.batches().read_all().equals(expected)
    with churn.reader() as reader:
        assert reader.snapshot().equals(expected)
        for i in (2, 5):
            as_of = (i + 1) * CHURN.interval_ms - 1
            assert reader.snapshot(as_of).equals(CHURN.expected(i + 1, as_of))


def test_columns_project_in_the_order_asked(churn):
    table = churn.batches(columns=["val", "key"]).read_all()
    expected = CHURN.expected(INTERVALS)
    assert table.column_names == ["val", "key"]
    assert table.equals(expected.select(["val", "key"]))
    for bad, match in ((["key", "nope"], "unknown column.*'nope'"), (["key", "key"], "distinct")):
        with pytest.raises(ValueError, match=match):
            churn.batches(columns=bad)
    assert not churn.state().readers  # a refused stream releases its reader


def test_as_of_outside_the_readable_times_is_refused(churn):
    upper = churn.upper
    with pytest.raises(NotReadable, match=f"as_of {upper} is not below the upper {upper}"):
        churn.batches(upper)
    churn.advance_since(20)
    with pytest.raises(NotReadable, match="as_of 19 is below the since 20"):
        churn.batches(19)
    assert not churn.state().readers


def test_a_shard_stream_holds_its_lease_until_exhausted_or_dropped(churn):
    stream = churn.batches(max_rows=50)
    assert len(churn.state().readers) == 1
    stream.read_next_batch()
    assert len(churn.state().readers) == 1
    stream.read_all()
    assert not churn.state().readers
    dropped = churn.batches()
    assert len(churn.state().readers) == 1
    del dropped
    gc.collect()
    assert not churn.state().readers


def test_empty_shard_streams_nothing(stores):
    blob, consensus = stores
    with open_shard("s", blob=blob, consensus=consensus, create=True) as shard:
        assert shard.batches().read_all().num_rows == 0
        assert shard.batches(columns=["diff"]).schema.names == ["diff"]
        assert not shard.state().readers


def test_a_stream_survives_compaction_and_gc_while_it_reads(churn, stores):
    """The stream's lease keeps what it selected: compaction and GC between
    its batches change nothing it returns."""
    blob, consensus = stores
    expected = CHURN.expected(INTERVALS)
    with (
        churn.reader() as reader,
        open_shard("s", blob=blob, consensus=consensus, config=MERGE, create=True) as other,
    ):
        stream = reader.batches(max_rows=64)
        got = [stream.read_next_batch()]
        assert other.compact().applied >= 1
        other.collect_garbage()
        for batch in stream:
            got.append(batch)
            other.collect_garbage()
        assert pa.Table.from_batches(got).equals(expected)
        assert churn.stats().part_refetches == 0


def test_a_stream_whose_parts_were_reclaimed_resumes_after_its_last_key(stores):
    """An expired lease lets GC delete the parts a stream selected; it goes on
    from refreshed state after the last key it sent, neither losing nor
    repeating a row."""
    blob, consensus = stores
    now = [0]
    config = ShardConfig(inline_max_bytes=0, blob_target_bytes=4096, reader_lease_ms=10)
    with (
        open_shard(
            "s", blob=blob, consensus=consensus, config=config, clock=lambda: now[0], create=True
        ) as shard,
        open_shard(
            "s", blob=blob, consensus=consensus, config=MERGE, clock=lambda: now[0], create=True
        ) as other,
    ):
        fill_churn(shard)
        expected = CHURN.expected(INTERVALS)
        with shard.reader() as reader:
            stream = reader.batches(max_rows=32)
            got = [stream.read_next_batch()]
            assert other.compact().applied >= 1
            now[0] += 1000  # the reader's lease runs out: GC may take what it selected
            assert other.collect_garbage().blobs_deleted
            got.extend(stream)
        assert pa.Table.from_batches(got).equals(expected)
        assert shard.stats().part_refetches >= 1


def test_duckdb_and_polars_read_the_stream(churn):
    import duckdb

    expected = CHURN.expected(INTERVALS)
    with churn.reader() as reader:
        connection = duckdb.connect()
        relation = reader.to_duckdb(connection)
        assert relation.aggregate("count(*), sum(diff), min(key), max(key)").fetchall() == [
            (
                expected.num_rows,
                expected.num_rows,
                *(expected["key"][i].as_py() for i in (0, -1)),
            )
        ]
        frame = reader.to_polars(columns=["key", "diff"])
        assert frame.to_arrow().equals(expected.select(["key", "diff"]))


# --- the sweep, on in-memory parts ------------------------------------------------


def chunked(data, rows):
    """A loader of ``data``'s tables in chunks of ``rows``."""
    return lambda p: [pa.Table.from_batches([b]) for b in data[p.key].to_batches(rows)]


def _parts(tables):
    """Blob parts (with key bounds) of ``tables`` and their data by key."""
    parts, data = [], {}
    for i, table in enumerate(tables):
        part, _ = P.blob_part(P.consolidate(table), f"p{i}")
        parts.append(part)
        data[part.key] = P.consolidate(table)
    return parts, data


@pytest.mark.parametrize("seed", range(20))
def test_windows_equal_consolidating_everything(seed):
    rng = random.Random(seed)
    tables = []
    for _ in range(rng.randint(1, 8)):
        lo = rng.randint(0, 50)
        rows = [
            (k, rng.choice("ab"), rng.randint(0, 5), rng.choice((-1, 1, 2)))
            for k in (rng.randint(lo, lo + rng.randint(0, 30)) for _ in range(rng.randint(1, 40)))
        ]
        tables.append(updates(rows))
    parts, data = _parts(tables)
    as_of = rng.randint(0, 5)
    after = rng.choice((None, rng.randint(0, 60)))
    window_rows = rng.choice((1, 3, 1000))
    got = list(
        W.windows(parts, chunked(data, rng.randint(1, 9)), as_of, SCHEMA, after, window_rows)
    )
    whole = P.at_time(P.concat(tables, SCHEMA), as_of)
    if after is not None:
        whole = whole.filter(pa.compute.greater(whole["key"], after))
    assert P.concat([t for t, _ in got], SCHEMA).equals(whole)
    cuts = [c for _, c in got]
    assert cuts == sorted(cuts)
    for (table, cut), previous in zip(got, [after, *cuts], strict=False):
        keys = table["key"].to_pylist()
        assert all((previous is None or k > previous) and k <= cut for k in keys)


def test_windows_hold_only_the_parts_that_overlap():
    """Disjoint key ranges: one window per part, each loaded alone."""
    tables = [updates([(k, "v", 0, 1) for k in range(i * 10, i * 10 + 10)]) for i in range(5)]
    parts, data = _parts(reversed(tables))
    got = list(W.windows(parts, chunked(data, 4), 0, SCHEMA))
    assert [c for _, c in got] == [9, 19, 29, 39, 49]
    assert [t.num_rows for t, _ in got] == [10] * 5


def test_a_large_part_is_consolidated_a_slice_at_a_time():
    parts, data = _parts([updates([(k, "v", 0, 1) for k in range(100)])])
    got = list(W.windows(parts, chunked(data, 4), 0, SCHEMA, window_rows=30))
    assert [c for _, c in got] == [29, 59, 89, 99]
    assert [t.num_rows for t, _ in got] == [30, 30, 30, 10]


def test_a_part_out_of_key_order_is_named():
    parts, data = _parts([updates([(k, "v", 0, 1) for k in range(10)])])
    data[parts[0].key] = data[parts[0].key].take([0, 1, 2, 3, 4, 9, 5, 6, 7, 8])
    with pytest.raises(ValueError, match=f"part {parts[0].key} is not sorted by key"):
        list(W.windows(parts, chunked(data, 3), 0, SCHEMA))


def test_windows_name_a_missing_part():
    parts, _ = _parts([updates([(1, "v", 0, 1)])])
    with pytest.raises(W.Missing) as missing:
        list(W.windows(parts, lambda p: None, 0, SCHEMA))
    assert missing.value.key == parts[0].key
    assert isinstance(parts[0], BlobPart)


def test_streams_read_while_appends_compaction_and_gc_run_are_never_wrong(tmp_path):
    """Another handle appends, compacts and collects garbage in a thread while
    streams read every as-of written so far, each checked against the
    workload's collection."""
    blob, consensus = f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/consensus.db"
    intervals = 16
    failures: list[BaseException] = []
    compacted: list[int] = []
    done = threading.Event()

    def churn_and_maintain() -> None:
        try:
            with open_shard(
                "s", blob=blob, consensus=consensus, config=MERGE, create=True
            ) as other:
                writer = other.writer()
                for i in range(INTERVALS, intervals):
                    t = i * CHURN.interval_ms
                    writer.compare_and_append_table(CHURN.updates(i), t, t + CHURN.interval_ms)
                    compacted.append(other.compact().applied)
                    other.collect_garbage()
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    with open_shard("s", blob=blob, consensus=consensus, config=SPLIT, create=True) as shard:
        fill_churn(shard)
        thread = threading.Thread(target=churn_and_maintain)
        thread.start()
        reads = 0
        while not done.is_set() or reads == 0:
            written = shard.upper // CHURN.interval_ms
            as_of = written * CHURN.interval_ms - 1
            got = shard.batches(as_of, max_rows=200).read_all()
            assert got.equals(CHURN.expected(written, as_of)), written
            reads += 1
        thread.join()
        assert not failures, failures
        assert sum(compacted) >= 1
        assert shard.batches().read_all().equals(CHURN.expected(intervals))
        assert reads >= 2 and not shard.state().readers


def test_a_part_not_sorted_by_key_is_read_whole_and_sorted():
    """A builder's part of an earlier version is its workers' parts one after
    another, not sorted by key, and its file says nothing; the loader sorts
    it. A part written now is sorted whatever order its rows came in."""
    from shardsink.storage.memory import MemoryBlob

    keys = list(range(40))
    random.Random(7).shuffle(keys)
    blob = MemoryBlob(f"unsorted-{random.random()}")
    loaded = {}
    table = updates([(k, format(k, "032x"), 0, 1) for k in keys])
    legacy = pa.BufferOutputStream()
    pq.write_table(table, legacy)  # as earlier versions wrote a builder's part
    part, now = P.blob_part(table, "now")
    for name, data in (("legacy", legacy.getvalue().to_pybytes()), ("now", now)):
        blob.set(name, data)
        assert P.sorted_by_key(pq.ParquetFile(pa.BufferReader(data))) == (name == "now")
        chunks = list(W.part_chunks(blob, "u", msgspec.structs.replace(part, key=name), SCHEMA, 7))
        assert max(c.num_rows for c in chunks) <= 7
        loaded[name] = pa.concat_tables(chunks)
    assert loaded["legacy"]["key"].to_pylist() == list(range(40))
    assert loaded["legacy"].equals(loaded["now"])


@pytest.mark.parametrize("kind", ["trickle", "churn"])
def test_a_slow_stream_while_appends_spine_compaction_and_gc_run_is_never_wrong(tmp_path, kind):
    """Must-show 3 of issue 15, on SQLite and files: streams read slowly,
    waiting after each record batch until another handle has done a round of
    maintenance (an append, a round of the spine's merges with
    ``compact_spine``, GC), in windows small enough that they fetch parts
    long after they selected them. Every stream equals the workload's
    collection at its as-of, none fails, merges and deletions happened while
    streams read, and the lease kept every part a stream selected."""
    workload = Workload(kind, rows_per_interval=300, interval_ms=10)
    config = ShardConfig(inline_max_bytes=0, blob_target_bytes=32 * 1024)
    blob, consensus = f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/consensus.db"
    stop = threading.Event()
    failures: list[BaseException] = []
    rounds = threading.Condition()
    done = {"rounds": 0, "merged": 0, "deleted": 0}

    def append_and_maintain() -> None:
        try:
            with open_shard(
                "s", blob=blob, consensus=consensus, config=config, create=True
            ) as other:
                writer, stats = other.writer(), ShardStats()
                i = other.upper // workload.interval_ms
                while not stop.is_set():
                    if i < 24:
                        t = i * workload.interval_ms
                        writer.compare_and_append_table(
                            workload.updates(i), t, t + workload.interval_ms
                        )
                        i += 1
                    report = spine_pass(other, target_bytes=config.blob_target_bytes, stats=stats)
                    deleted = len(other.collect_garbage().blobs_deleted)
                    with rounds:
                        done["rounds"] += 1
                        done["merged"] += report.applied
                        done["deleted"] += deleted
                        rounds.notify_all()
        except BaseException as exc:
            failures.append(exc)
        finally:
            with rounds:
                stop.set()
                rounds.notify_all()

    def next_round() -> None:
        with rounds:
            seen = done["rounds"]
            assert rounds.wait_for(lambda: done["rounds"] > seen or stop.is_set(), 60)

    with open_shard("s", blob=blob, consensus=consensus, config=config, create=True) as shard:
        writer = shard.writer()
        for i in range(8):
            t = i * workload.interval_ms
            writer.compare_and_append_table(workload.updates(i), t, t + workload.interval_ms)
        thread = threading.Thread(target=append_and_maintain)
        thread.start()
        during = {"merged": 0, "deleted": 0}
        try:
            for _ in range(4):
                written = shard.upper // workload.interval_ms
                as_of = written * workload.interval_ms - 1
                expected = workload.expected(written, as_of)
                before = dict(done)
                got = []
                stream = shard.batches(as_of, max_rows=expected.num_rows // 8 + 1, window_rows=200)
                for batch in stream:
                    got.append(batch)
                    next_round()
                assert pa.Table.from_batches(got, shard.schema).equals(expected), written
                for name in during:
                    during[name] += done[name] - before[name]
        finally:
            stop.set()
            thread.join(60)
        assert not thread.is_alive() and not failures, failures
        assert during["merged"] and during["deleted"], during
        assert shard.stats().part_refetches == 0
        assert not shard.state().readers
