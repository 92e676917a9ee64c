"""The reader's checks: every bad reference or damaged part is a clear error
naming it, never a crash and never a silently wrong batch."""

from __future__ import annotations

import gc
import os
import random

import posix_ipc
import pyarrow as pa
import pytest

from shardsink.shm import (
    Arena,
    CorruptPart,
    PartOutOfBounds,
    PartRef,
    SchemaMismatch,
    SegmentName,
    SegmentReader,
    UnknownSegment,
    decode_part,
    segments as shm_segments,
)
from shardsink.shm.arena import write_stream
from tests.helpers.shm import make_part, part_number


@pytest.fixture
def written(cluster):
    """The reference of part 1 (300 rows) in a live arena, and a reader."""
    with Arena(cluster, segment_size=1 << 20, capacity=4 << 20) as arena:
        ref = arena.try_write(make_part(1, 300))
        with SegmentReader(cluster) as reader:
            yield ref, reader


def _stream(batch: pa.RecordBatch, part_id: int | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    write_stream(sink, batch, part_id)
    return sink.getvalue().to_pybytes()


def _poke(ref: PartRef, data: bytes, at: int = 0) -> None:
    """Overwrite bytes of a part in place, as a stray writer would."""
    shm = posix_ipc.SharedMemory(f"/{ref.segment}")
    try:
        os.pwrite(shm.fd, data, ref.offset + at)
    finally:
        shm.close_fd()


def test_unknown_segment(written, cluster):
    ref, reader = written
    name = SegmentName.parse(ref.segment)
    missing = str(SegmentName(cluster, name.pid, name.start, name.n + 1000))
    with pytest.raises(UnknownSegment, match=f"segment {missing} does not exist"):
        reader.read(PartRef(missing, 0, 100, 0))


@pytest.mark.parametrize(
    "segment",
    ["psql.123", "shardsink.other.1.2.3", "shardsink.x", "/etc/passwd", "shardsink..1.2.3"],
)
def test_segments_not_of_this_cluster_are_refused(written, segment):
    _, reader = written
    with pytest.raises(UnknownSegment):
        reader.read(PartRef(segment, 0, 100, 0))


def test_only_accepted_creators(written, cluster):
    ref, _ = written
    with (
        SegmentReader(cluster, creators=[os.getpid() + 1]) as reader,
        pytest.raises(UnknownSegment, match=f"created by pid {os.getpid()}"),
    ):
        reader.read(ref)
    with SegmentReader(cluster, creators=[os.getpid()]) as reader:
        assert part_number(reader.read(ref)) == 1


def test_a_segment_others_may_open_is_refused(cluster):
    name = SegmentName.fresh(cluster)
    shm = posix_ipc.SharedMemory(name.ipc_name, posix_ipc.O_CREX, mode=0o600, size=1 << 16)
    try:
        os.fchmod(shm.fd, 0o644)
        with SegmentReader(cluster) as reader, pytest.raises(UnknownSegment, match="mode 644"):
            reader.read(PartRef(str(name), 0, 100, 0))
    finally:
        shm.close_fd()
        shm.unlink()


@pytest.mark.parametrize(
    ("offset", "length"), [(0, (1 << 20) + 1), (1 << 20, 5), ((1 << 20) - 10, 11), (10**12, 5)]
)
def test_a_length_past_the_segment_end(written, offset, length):
    ref, reader = written
    with pytest.raises(PartOutOfBounds, match=f"segment {ref.segment}.*past the segment's end"):
        reader.read(PartRef(ref.segment, offset, length, ref.id))


def test_negative_or_empty_spans_never_reach_the_mapping(written):
    ref, reader = written
    for offset, length in ((-1, 10), (0, 0), (0, -5)):
        with pytest.raises(PartOutOfBounds):
            reader.read(PartRef(ref.segment, offset, length, ref.id))


def test_every_truncation_is_detected(written):
    """Cutting a part short anywhere is an error; the one exception, cutting
    exactly the 8-byte end-of-stream marker, still yields the exact batch."""
    ref, reader = written
    for length in range(1, ref.length, 97):
        with pytest.raises(CorruptPart, match=f"length {length} of segment {ref.segment}"):
            reader.read(PartRef(ref.segment, ref.offset, length, ref.id))
    assert part_number(reader.read(PartRef(ref.segment, ref.offset, ref.length - 8, ref.id))) == 1


def test_trailing_bytes_are_detected(written):
    ref, reader = written
    with pytest.raises(CorruptPart, match="stream ends at byte"):
        reader.read(PartRef(ref.segment, ref.offset, ref.length + 64, ref.id))


def test_a_shifted_offset_is_detected(written):
    ref, reader = written
    for shift in (8, 64, 200):
        with pytest.raises(CorruptPart, match="not a valid Arrow IPC part"):
            reader.read(PartRef(ref.segment, ref.offset + shift, ref.length - shift, ref.id))


def test_a_stale_reference_is_detected(cluster):
    """A reference to space since released and rewritten names the wrong stamp."""
    with Arena(cluster) as arena, SegmentReader(cluster) as reader:
        old = arena.try_write(make_part(1, 300))
        arena.release(old)
        new = arena.try_write(make_part(2, 300))
        assert (new.segment, new.offset, new.length) == (old.segment, old.offset, old.length)
        with pytest.raises(CorruptPart, match=f"expected part id {old.id}"):
            reader.read(old)
        assert part_number(reader.read(new)) == 2


def test_overwritten_metadata_is_detected(written):
    ref, reader = written
    _poke(ref, b"\xff" * 64, at=8)
    with pytest.raises(CorruptPart, match=f"segment {ref.segment}"):
        reader.read(ref)


def test_random_damage_never_crashes(written):
    """Bytes overwritten anywhere, or the part cut short: each read either
    raises CorruptPart or (with full validation) returns a batch that is safe to
    use. A flipped data byte cannot be told from data; see the reader's doc."""
    rng = random.Random(5)
    batch = make_part(1, 300)
    good = _stream(batch, 7)
    outcomes = {"error": 0, "batch": 0}
    for _ in range(400):
        data = bytearray(good)
        for _ in range(rng.choice((1, 2, 8))):
            data[rng.randrange(rng.choice((len(data), 700)))] = rng.randrange(256)
        if rng.random() < 0.2:
            data = data[: rng.randrange(1, len(data))]
        try:
            got = decode_part(pa.py_buffer(bytes(data)), "fuzzed", part_id=7, full_validation=True)
        except CorruptPart:
            outcomes["error"] += 1
        else:
            got.to_pylist()
            outcomes["batch"] += 1
    assert outcomes["error"] > 200 and outcomes["batch"] > 0


@pytest.mark.parametrize("schema_known", [False, True], ids=["stream-reader", "usual-path"])
def test_not_exactly_one_batch(monkeypatch, schema_known):
    """Refused by the stream reader, and by the usual path once the schema is known."""
    batch = make_part(1, 10)
    monkeypatch.setattr(shm_segments, "_schemas", {})
    if schema_known:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        decode_part(sink.getvalue(), "one")
        assert shm_segments._schemas
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
        writer.write_batch(batch)
    with pytest.raises(CorruptPart, match="more than one record batch"):
        decode_part(sink.getvalue(), "two")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema):
        pass
    with pytest.raises(CorruptPart, match="no record batch"):
        decode_part(sink.getvalue(), "none")
    with pytest.raises(CorruptPart, match="not a valid Arrow IPC part"):
        decode_part(pa.py_buffer(b"PAR1" * 10), "parquet-ish")


def test_schema_is_checked_when_given(written):
    ref, reader = written
    other = pa.schema([("key", pa.int32())])
    with pytest.raises(SchemaMismatch, match=f"segment {ref.segment}"):
        reader.read(ref, other)
    assert part_number(reader.read(ref, make_part(0, 0).schema)) == 1


def test_batches_outlive_forget_and_close(written):
    """Dropping mappings while batches point into them neither crashes nor
    invalidates the batches; the mapping goes with the last batch."""
    ref, reader = written
    batch = reader.read(ref)
    reader.forget([ref.segment])
    assert reader.mapped == []
    assert part_number(batch) == 1
    batch2 = reader.read(ref)  # mapped afresh
    reader.close()
    reader.close()
    assert part_number(batch2) == 1
    del batch, batch2
    gc.collect()
    with pytest.raises(ValueError, match="closed"):
        reader.read(ref)


def test_the_usual_path_checks_what_the_stream_reader_checks(cluster, monkeypatch):
    """Once a schema has been read, parts with it skip the stream reader; a
    wrong stamp or trailing bytes still come out as errors (a second batch:
    ``test_not_exactly_one_batch``)."""
    with Arena(cluster) as arena, SegmentReader(cluster) as reader:
        first = arena.try_write(make_part(1, 300))
        assert part_number(reader.read(first)) == 1  # the schema is known from here on
        second = arena.try_write(make_part(2, 300))
        with monkeypatch.context() as patch:
            patch.setattr(shm_segments, "_read_any", None)  # not called: the usual path
            batch = reader.read(second)
        assert part_number(batch) == 2
        mapping = reader.mapping(second.segment)  # zero-copy on this path too
        for buf in (b for col in batch.columns for b in col.buffers() if b is not None):
            assert mapping.address <= buf.address
            assert buf.address + buf.size <= mapping.address + mapping.size
        with pytest.raises(CorruptPart, match=f"expected part id {first.id}"):
            reader.read(PartRef(second.segment, second.offset, second.length, first.id))
        with pytest.raises(CorruptPart, match="stream ends at byte"):
            reader.read(PartRef(second.segment, second.offset, second.length + 64, second.id))


def test_parts_with_dictionaries(cluster):
    """Dictionary-encoded columns travel too (the stream reader reads them)."""
    batch = pa.record_batch(
        {
            "key": pa.array([1, 2, 3], pa.int64()),
            "tag": pa.array(["a", "b", "a"]).dictionary_encode(),
        }
    )
    with Arena(cluster) as arena, SegmentReader(cluster) as reader:
        for _ in range(2):
            ref = arena.try_write(batch)
            assert reader.read(ref).equals(batch)
            arena.release(ref)
