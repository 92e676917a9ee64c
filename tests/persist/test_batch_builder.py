"""``persist.batches.BatchBuilder``: the data side of a shared batch."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from shardsink.persist import parts as P
from shardsink.persist.batches import BatchBuilder, load_part
from shardsink.persist.digest import digest
from shardsink.persist.state import BlobPart, InlinePart
from shardsink.persist.stats import ShardStats
from shardsink.storage.errors import DeterminateError
from shardsink.storage.memory import MemoryBlob
from shardsink.workloads import SCHEMA, Workload

WORKLOAD = Workload("trickle", rows_per_interval=400, interval_ms=1000)


def _blob() -> MemoryBlob:
    return MemoryBlob(uuid.uuid4().hex)  # named memory stores are process-wide


def _builder(blob, *, target=1 << 30, inline=4096, stats=None, digests=True) -> BatchBuilder:
    return BatchBuilder(
        blob,
        "s",
        "w.1",
        0,
        1000,
        inline_max_bytes=inline,
        target_bytes=target,
        stats=stats or ShardStats(),
        digests=digests,
    )


def _slices(n: int) -> list[pa.RecordBatch]:
    """Interval 0 of the trickle workload as ``n`` workers' record batches."""
    return [WORKLOAD.updates(0, w, n).combine_chunks().to_batches()[0] for w in range(n)]


def _rows(blob, batch) -> pa.Table:
    tables = [load_part(blob, "s", p, SCHEMA) for p in batch.parts]
    return P.consolidate(pa.concat_tables(tables))


class _Sized:
    """Stands in for a record batch and counts how often its size is read."""

    reads = 0

    def __init__(self) -> None:
        self.num_rows = 1

    @property
    def nbytes(self) -> int:
        _Sized.reads += 1
        return 10


def test_adding_is_constant_time_whatever_was_added_before():
    """The reference's quadratic bug summed every held part's size on each add;
    here each added batch's size is read exactly once, however many are held."""
    builder = _builder(_blob(), digests=False)  # a stand-in has no rows to digest
    _Sized.reads = 0
    for _ in range(10_000):
        assert builder.add(_Sized()) is False
    assert _Sized.reads == 10_000
    assert builder.held_bytes == 100_000
    assert builder.rows == 10_000


def test_tiny_result_is_inline_and_holds_exactly_the_rows_added():
    blob = _blob()
    stats = ShardStats()
    builder = _builder(blob, inline=1 << 20, stats=stats)
    for batch in _slices(4):
        assert builder.add(batch) is False
    batch = builder.finish()
    assert [type(p) for p in batch.parts] == [InlinePart]
    assert batch.rows == 400 and (batch.lower, batch.upper) == (0, 1000)
    assert stats.blob_puts == 0
    assert _rows(blob, batch).equals(WORKLOAD.expected(1, as_of=0))
    assert batch.digest == digest(_rows(blob, batch))


def test_parts_are_cut_at_the_target_and_written_to_blob():
    blob = _blob()
    stats = ShardStats()
    slices = _slices(8)
    target = slices[0].nbytes * 3 - 1  # a part every third slice
    builder = _builder(blob, target=target, inline=0, stats=stats)
    written = [builder.add(b) for b in slices]
    assert written == [False, False, True, False, False, True, False, False]
    assert builder.held_bytes == sum(b.nbytes for b in slices[6:])
    batch = builder.finish()
    assert [type(p) for p in batch.parts] == [BlobPart] * 3
    assert [p.rows for p in batch.parts] == [150, 150, 100]
    assert stats.blob_puts == 3 and stats.blob_put_bytes == sum(
        p.encoded_bytes for p in batch.parts
    )
    assert _rows(blob, batch).equals(WORKLOAD.expected(1, as_of=0))


def test_abort_deletes_what_was_written_and_finish_is_once():
    blob = _blob()
    slices = _slices(2)
    builder = _builder(blob, target=1, inline=0)
    assert builder.add(slices[0]) is True
    assert len(list(blob.list("s/"))) == 1
    assert len(builder.abort()) == 1
    assert list(blob.list("s/")) == []
    assert builder.abort() == []
    with pytest.raises(ValueError, match="already finished or aborted"):
        builder.add(slices[1])
    done = _builder(blob)
    done.add(slices[1])
    batch = done.finish()
    assert done.abort() == []  # the batch owns its parts now
    with pytest.raises(ValueError, match="already finished"):
        done.finish()
    assert batch.rows == slices[1].num_rows


def test_empty_builder_gives_a_batch_without_parts():
    builder = _builder(_blob())
    assert builder.add(_slices(1)[0].slice(0, 0)) is False
    batch = builder.finish()
    assert batch.parts == () and batch.rows == 0


def test_rows_outside_the_interval_are_refused():
    batch = Workload("trickle", 10).updates(3).to_batches()[0]  # ts = 3000
    builder = _builder(_blob())
    builder.add(batch)
    with pytest.raises(ValueError, match=r"ts outside the batch interval \[0, 1000\)"):
        builder.finish()
    with pytest.raises(ValueError, match="lower < upper"):
        BatchBuilder(
            _blob(), "s", "w.1", 5, 5, inline_max_bytes=0, target_bytes=1, stats=ShardStats()
        )


def test_an_abort_whose_delete_fails_leaves_the_blob_to_the_sweep(caplog):
    """Aborting is cleanup after a failure: a failed delete is logged, never
    raised over the failure that caused the abort."""
    blob = _blob()
    builder = _builder(blob, target=1, inline=0)
    builder.add(_slices(1)[0])

    def refuse(key: str) -> None:
        raise DeterminateError(f"injected: delete {key}")

    blob.delete = refuse
    keys = builder.abort()
    assert len(keys) == 1 and list(blob.list("s/")) == keys
    assert f"could not delete {keys[0]} (the leaked-blob sweep will)" in caplog.text


def test_write_cuts_a_part_before_the_target():
    blob = _blob()
    builder = _builder(blob)  # a target of 1 GiB is never reached here
    slices = _slices(3)
    assert builder.add(slices[0]) is False and builder.held_bytes > 0
    assert builder.add(slices[1], write=True) is True and builder.held_bytes == 0
    assert builder.add(slices[2]) is False
    batch = builder.finish()
    assert len(batch.parts) == 2 and isinstance(batch.parts[0], BlobPart)
    assert _rows(blob, batch).num_rows == sum(s.num_rows for s in slices)
