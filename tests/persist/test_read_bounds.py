"""Every part a writer writes is sorted (key, val, ts) and says so, and the
sweep then holds a window plus one chunk of each part it spans, never a
part whole; unsorted parts of earlier versions are still read, whole.

The bounds are checked with counts (rows decoded behind each chunk a loader
hands out, rows the sweep holds at each window), not with timings or RSS.
"""

from __future__ import annotations

import functools
import io
import uuid
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink.persist import parts as P, windows as W
from shardsink.persist.batches import BatchBuilder, build_batch, flush_inline
from shardsink.persist.errors import CorruptState
from shardsink.persist.state import Batch, BlobPart, InlinePart
from shardsink.persist.stats import ShardStats
from shardsink.storage import open_blob
from shardsink.storage.memory import MemoryBlob
from tests.helpers.persist import SCHEMA, updates

PARTS = 8  # builders' parts of one interval, every one spanning every key
WORKERS = 4  # workers' parts in each builder part
ROWS = 12_000  # rows per worker part
CHUNK = 2048
WINDOW = 4096


def _builder(blob, target_bytes: int = 1 << 30) -> BatchBuilder:
    return BatchBuilder(
        blob,
        "s",
        lower=0,
        upper=10,
        inline_max_bytes=0,
        target_bytes=target_bytes,
        stats=ShardStats(),
        writer="w.1",
    )


@functools.cache
def _worker_rows(part: int, worker: int) -> pa.Table:
    """A worker's consolidated part: every ``PARTS * WORKERS``-th key, so the
    builders' parts overlap over the whole key range."""
    stride = PARTS * WORKERS
    keys = range(part * WORKERS + worker, ROWS * stride, stride)
    return P.consolidate(updates([(k, format(k, "032x"), k % 10, 1) for k in keys]))


def _builder_parts(blob) -> list[BlobPart]:
    """``PARTS`` parts as builders write them: each its workers' parts added
    one after another."""
    parts = []
    for p in range(PARTS):
        builder = _builder(blob)
        for w in range(WORKERS):
            for batch in _worker_rows(p, w).to_batches():
                builder.add(batch)
        (part,) = builder.finish().parts
        parts.append(part)
    return parts


def _legacy_parts(blob: MemoryBlob) -> list[BlobPart]:
    """The same rows as parts of an earlier version: unsorted, and the file
    says nothing."""
    parts = []
    for p in range(PARTS):
        table = pa.concat_tables([_worker_rows(p, w) for w in range(WORKERS)])
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        key = f"s/part/legacy-{p}.parquet"
        blob.set(key, sink.getvalue().to_pybytes())
        part, _ = P.blob_part(table, key)
        parts.append(part)
    return parts


class Counting:
    """A loader around :func:`~.W.part_chunks` counting, for every chunk
    it hands out, the rows decoded behind it (its key buffer's rows: a slice
    of a part loaded whole shows the whole part), and the rows handed out."""

    def __init__(self, blob) -> None:
        self.load = partial(W.part_chunks, blob, "s", schema=SCHEMA, rows=CHUNK)
        self.behind: list[int] = []
        self.handed = 0

    def __call__(self, part):
        chunks = self.load(part)
        return None if chunks is None else self._count(chunks)

    def _count(self, chunks):
        for chunk in chunks:
            keys = chunk["key"].combine_chunks() if chunk["key"].num_chunks > 1 else None
            arrays = [keys] if keys is not None else chunk["key"].chunks
            self.behind.append(sum(a.buffers()[1].size // 8 for a in arrays))
            self.handed += chunk.num_rows
            yield chunk


def _sweep(parts, loader: Counting) -> tuple[pa.Table, int]:
    """The merged windows' rows, and the most rows the sweep held (handed
    out by the loader, not yet in a window) when it yielded a window."""
    taken, emitted, held = [], 0, 0
    for table, _ in W.key_windows(parts, loader, 100, SCHEMA, window_rows=WINDOW):
        emitted += table.num_rows
        held = max(held, loader.handed - emitted)
        taken.append(table)
    return pa.concat_tables(taken), held


@functools.cache
def _expected() -> pa.Table:
    rows = [_worker_rows(p, w) for p in range(PARTS) for w in range(WORKERS)]
    return P.consolidate(pa.concat_tables(rows))


def test_a_builders_part_is_sorted_by_key_val_ts_and_its_file_says_so():
    blob = MemoryBlob(uuid.uuid4().hex)
    builder = _builder(blob, target_bytes=300_000)  # several parts, each cut mid-worker
    for w in range(WORKERS):
        for batch in _worker_rows(0, w).to_batches(max_chunksize=1000):
            builder.add(batch)
    batch = builder.finish()
    assert len(batch.parts) > 2 and batch.rows == WORKERS * ROWS
    for part in batch.parts:
        file = pq.ParquetFile(pa.BufferReader(blob.get(part.key)))
        assert P.sorted_by_key(file)
        names = [SCHEMA.names[c.column_index] for c in file.metadata.row_group(0).sorting_columns]
        assert names == ["key", "val", "ts"]
        table = file.read()
        assert P.in_update_order(table) and table.num_rows == part.rows
        assert (part.key_lo, part.key_hi) == (table["key"][0].as_py(), table["key"][-1].as_py())


def test_build_batch_flush_inline_and_inline_parts_are_sorted():
    blob = MemoryBlob(uuid.uuid4().hex)
    shuffled = pa.concat_tables([_worker_rows(0, w).slice(0, 40) for w in range(WORKERS)])
    inline = P.inline_part(shuffled, 1 << 20)
    assert P.in_update_order(P.decode_inline(inline, SCHEMA))
    batch = Batch(id="b", lower=0, upper=10, parts=(inline,), rows=inline.rows)
    flushed = flush_inline(
        blob=blob,
        shard="s",
        batch=batch,
        schema=SCHEMA,
        stats=ShardStats(),
        writer="w.1",
    )
    consolidated = P.consolidate(pa.concat_tables([_worker_rows(0, w) for w in range(WORKERS)]))
    built = build_batch(
        blob,
        "s",
        consolidated,
        0,
        10,
        inline_max_bytes=0,
        target_bytes=200_000,
        stats=ShardStats(),
        writer="w.1",
    )
    assert len(built.parts) > 2
    for part in (*flushed.parts, *built.parts):
        file = pq.ParquetFile(pa.BufferReader(blob.get(part.key)))
        assert P.sorted_by_key(file) and P.in_update_order(file.read())


def test_a_list_key_is_sorted_by_value_and_the_file_claims_no_order_parquet_cannot_say():
    """Arrow sorts no lists: a part of list keys is sorted by their
    canonical encoding (element by element, a prefix first), and its file
    declares no ``sorting_columns`` (Parquet's are leaves, which a list's
    order is not), so readers load it whole."""
    schema = pa.schema([("key", pa.list_(pa.int64())), ("val", pa.string())])
    table = P.conform(
        pa.table(
            {"key": [[2], [1, 5], [1]], "val": ["b", "a", "c"], "ts": [0] * 3, "diff": [1] * 3}
        ),
        P.full_schema(schema),
    )
    part, data = P.blob_part(table, "k")
    file = pq.ParquetFile(pa.BufferReader(data))
    assert not P.sorted_by_key(file)
    assert file.read()["key"].to_pylist() == [[1], [1, 5], [2]]
    assert part.rows == 3 and part.key_lo is None


@pytest.fixture
def store(request, tmp_path):
    """A blob store of the kind ``request.param`` names (S3: the suite's server)."""
    kind = request.param
    if kind == "memory":
        uri = f"memory://bounds-{uuid.uuid4().hex}"
    elif kind == "file":
        uri = f"file://{tmp_path}/blob"
    else:
        server = request.getfixturevalue("s3_server")
        uri = server.blob_uri(server.new_bucket(), "bounds")
    blob = open_blob(uri)
    yield blob
    blob.close()


@pytest.mark.parametrize(
    ("store", "through"),
    [
        ("memory", "get"),
        ("memory", "open_input"),
        ("file", "open_input"),
        pytest.param("s3", "open_input", marks=pytest.mark.s3),
    ],
    indirect=["store"],
)
def test_overlapping_sorted_parts_hold_a_window_and_a_chunk_of_each(monkeypatch, store, through):
    """Eight builders' parts that all span every key: each chunk the loader
    hands out has at most ``CHUNK`` rows decoded behind it, and the sweep
    holds at most a window plus a chunk of each part at any window; the
    parts are read through ``open_input`` (large ones) or one ``get``
    (small ones), never both, and the merge equals consolidating all."""
    monkeypatch.setattr(W, "WHOLE_GET_BYTES", 0 if through == "open_input" else 1 << 30)
    blob = _Calls(store)
    parts = _builder_parts(store)
    loader = Counting(blob)
    merged, held = _sweep(parts, loader)
    assert merged.num_rows == PARTS * WORKERS * ROWS
    assert P.consolidate(merged).equals(_expected())
    assert len(loader.behind) >= PARTS * WORKERS * ROWS // CHUNK
    assert max(loader.behind) <= CHUNK + 8  # Arrow may round a buffer up to 64 bytes
    assert held <= WINDOW + PARTS * CHUNK
    keys = {p.key for p in parts}
    assert set(blob.calls[through]) == keys and len(blob.calls[through]) == PARTS
    assert not blob.calls["open_input" if through == "get" else "get"]


def test_unsorted_parts_of_earlier_versions_are_read_whole_and_sorted():
    """The stated bound for them: each such part whole (its chunks are slices
    of the part, sorted), so the sweep's chunks have whole parts behind them."""
    blob = MemoryBlob(uuid.uuid4().hex)
    parts = _legacy_parts(blob)
    loader = Counting(blob)
    merged, held = _sweep(parts, loader)
    assert P.consolidate(merged).equals(_expected())
    assert max(loader.behind) == WORKERS * ROWS
    assert held <= WINDOW + PARTS * CHUNK  # the sweep's share is bounded all the same


def test_a_part_deleted_while_it_is_read_is_missing_and_a_failing_one_is_corrupt(monkeypatch):
    """A store whose reads fail once the key is gone (S3): the sweep raises
    :class:`~.W.Missing`, so a reader re-reads from refreshed state; a
    read failing while the key is there is an error naming the part."""
    monkeypatch.setattr(W, "WHOLE_GET_BYTES", 0)
    monkeypatch.setattr(W, "READ_BUFFER_BYTES", 4096)  # so reads go on after the first window
    inner = MemoryBlob(uuid.uuid4().hex)
    parts = _builder_parts(inner)
    blob = _FailingReads(inner)
    loader = partial(W.part_chunks, blob, "s", schema=SCHEMA, rows=CHUNK)
    windows = W.key_windows(parts, loader, 100, SCHEMA, window_rows=WINDOW)
    next(windows)
    inner.delete(parts[3].key)
    with pytest.raises(W.Missing) as missing:
        list(windows)
    assert missing.value.key == parts[3].key
    inner.set(parts[3].key, blob.deleted[parts[3].key])
    blob.failing = {parts[5].key}
    with pytest.raises(CorruptState, match=f"{parts[5].key}: connection reset"):
        list(W.key_windows(parts, loader, 100, SCHEMA, window_rows=WINDOW))


def test_an_inline_part_out_of_order_from_an_earlier_version_is_sorted():
    table = pa.concat_tables([_worker_rows(0, w).slice(0, 5) for w in range(WORKERS)])
    message = table.combine_chunks().to_batches()[0].serialize()
    part = InlinePart(data=message.to_pybytes(), codec="none", **P._bounds(table))
    chunks = W.part_chunks(MemoryBlob(uuid.uuid4().hex), "s", part, SCHEMA, 7)
    keys = pa.concat_tables(chunks)["key"].to_pylist()
    assert keys == sorted(table["key"].to_pylist())


class _Calls:
    """A blob store recording which keys were fetched whole and opened."""

    def __init__(self, inner) -> None:
        self.inner, self.uri = inner, inner.uri
        self.calls: dict[str, list[str]] = {"get": [], "open_input": []}

    def get(self, key):
        self.calls["get"].append(key)
        return self.inner.get(key)

    def open_input(self, key):
        self.calls["open_input"].append(key)
        return self.inner.open_input(key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _FailingReads:
    """A blob store whose opened files fail their reads once their key is
    deleted, as S3's ranged GETs do, or while it is in ``failing``."""

    def __init__(self, inner) -> None:
        self.inner, self.uri = inner, inner.uri
        self.failing: set[str] = set()
        self.deleted: dict[str, bytes] = {}

    def open_input(self, key):
        data = self.inner.get(key)
        return None if data is None else pa.PythonFile(_Raw(self, key, data), mode="r")

    def fails(self, key: str, data: bytes) -> bool:
        if self.inner.stat(key) is None:
            self.deleted[key] = data
            return True
        return key in self.failing

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _Raw(io.BytesIO):
    def __init__(self, owner: _FailingReads, key: str, data: bytes) -> None:
        super().__init__(data)
        self.owner, self.key, self.data = owner, key, data

    def read(self, n=-1):
        if self.owner.fails(self.key, self.data):
            raise OSError("connection reset")
        return super().read(n)
