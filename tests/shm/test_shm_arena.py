"""The arena: segments, allocation, bounds, and the reader's zero-copy reads in
one process (the cross-process paths are in test_shm_link and test_shm_kill)."""

from __future__ import annotations

import itertools
import os
import stat

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shardsink.shm import Arena, SegmentName, SegmentReader, list_segments, size_bound
from shardsink.shm.arena import write_stream
from tests.helpers.shm import make_part, part_number, shm_ranges


def _exact(batch: pa.RecordBatch) -> int:
    mock = pa.MockOutputStream()
    write_stream(mock, batch, 0)
    return mock.size()


def _varied_batches() -> list[pa.RecordBatch]:
    d = pa.array(["x", "y", None, "x"]).dictionary_encode()
    return [
        make_part(3, 1000),
        make_part(4, 0),
        pa.record_batch({"a": pa.array([1, None, 3]), "s": pa.array(["", None, "zz"])}),
        pa.record_batch({"l": pa.array([[1, 2], None, []]), "st": pa.array([{"x": 1}] * 3)}),
        pa.record_batch({"d": d, "ld": pa.ListArray.from_arrays([0, 1, 4, 4, 4], d)}),
        make_part(5, 100).slice(7, 50),
    ]


def test_segments_are_private_and_named_after_cluster_and_creator(cluster):
    with Arena(cluster, segment_size=1 << 20, capacity=4 << 20) as arena:
        ref = arena.try_write(make_part(0, 10))
        info = os.stat(f"/dev/shm/{ref.segment}")
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == os.geteuid()
        name = SegmentName.parse(ref.segment)
        assert (name.cluster, name.pid) == (cluster, os.getpid())
        assert list_segments(cluster) == [name]
    assert list_segments(cluster) == []


@pytest.mark.parametrize("batch", _varied_batches(), ids=lambda b: str(b.schema.names))
def test_round_trip_and_size_bound(cluster, batch):
    bound = size_bound(batch)
    assert _exact(batch) <= bound <= _exact(batch) + 256
    with Arena(cluster) as arena, SegmentReader(cluster) as reader:
        ref = arena.try_write(batch, bound)
        assert ref.length == _exact(batch)
        assert reader.read(ref, batch.schema).equals(batch)


def test_read_is_zero_copy(cluster):
    """Every buffer of the batch read lies inside the reader's mapping of the
    segment, which /proc/self/maps shows is /dev/shm/<segment> (criterion 1)."""
    with Arena(cluster) as arena, SegmentReader(cluster) as reader:
        ref = arena.try_write(make_part(1, 20_000))
        batch = reader.read(ref)
        mapping = reader.mapping(ref.segment)
        lo, hi = mapping.address, mapping.address + mapping.size
        assert any(a <= lo and hi <= b for a, b in shm_ranges("self", ref.segment))
        buffers = [b for col in batch.columns for b in col.buffers() if b is not None]
        assert len(buffers) == 5  # key, val offsets, val data, ts, diff (no nulls)
        for buf in buffers:
            assert lo <= buf.address and buf.address + buf.size <= hi
        assert part_number(batch) == 1


def test_first_fit_reuses_the_lowest_free_space(cluster):
    with Arena(cluster, segment_size=1 << 20, capacity=4 << 20) as arena:
        batch = make_part(0, 2000)
        a, b, c = (arena.try_write(batch) for _ in range(3))
        assert a.offset == 0 and a.offset < b.offset < c.offset
        arena.release(a)
        again = arena.try_write(batch)
        assert (again.segment, again.offset) == (a.segment, a.offset)
        assert again.id != a.id


def test_out_of_order_releases_coalesce(cluster):
    with Arena(cluster, segment_size=1 << 20, capacity=4 << 20) as arena:
        refs = [arena.try_write(make_part(i, 500)) for i in range(6)]
        for i in (3, 0, 5, 1, 4, 2):
            arena.release(refs[i])
        assert arena.outstanding == 0 and arena.outstanding_bytes == 0
        whole = make_part(9, (1 << 20) // 64)  # close to a whole segment
        assert arena.try_write(whole).offset == 0
        assert len(arena.segments) == 1


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), min_size=1, max_size=60))
def test_outstanding_parts_are_never_overwritten(cluster, steps):
    """Any interleaving of writes and releases (in any order) keeps every
    outstanding part intact, disjoint from the others, and inside its segment."""
    with (
        Arena(cluster, segment_size=64 << 10, capacity=512 << 10) as arena,
        SegmentReader(cluster) as reader,
    ):
        held = {}
        for n, (write, rows) in enumerate(steps):
            if write or not held:
                ref = arena.try_write(make_part(n, 1 + rows % 1500))
                if ref is not None:
                    held[ref] = n
            else:
                victim = sorted(held, key=lambda r: (r.id * 7919) % 101)[0]
                arena.release(victim)
                del held[victim]
            spans = sorted((r.segment, r.offset, r.offset + r.length) for r in held)
            for (seg1, _, end1), (seg2, start2, _) in itertools.pairwise(spans):
                assert seg1 != seg2 or end1 <= start2
            assert arena.mapped_bytes <= arena.capacity
        for ref, n in held.items():
            assert part_number(reader.read(ref)) == n


def test_full_arena_returns_none_until_a_release(cluster):
    with Arena(cluster, segment_size=256 << 10, capacity=512 << 10) as arena:
        batch = make_part(0, 2000)  # ~120 KiB: two per segment
        refs = []
        while (ref := arena.try_write(batch)) is not None:
            refs.append(ref)
        assert len(refs) == 4 and arena.mapped_bytes == 512 << 10
        arena.release(refs[2])
        assert arena.try_write(batch) is not None
        assert arena.try_write(batch) is None


def test_oversize_parts_get_their_own_pooled_segment(cluster):
    with Arena(cluster, segment_size=64 << 10, capacity=1 << 20) as arena:
        big = make_part(0, 5000)  # ~300 KiB
        ref = arena.try_write(big)
        assert len(arena.segments) == 1 and arena.mapped_bytes == 320 << 10
        arena.release(ref)
        again = arena.try_write(big)
        assert again.segment == ref.segment  # reused, not recreated
        small = arena.try_write(make_part(1, 10))
        assert small.segment == ref.segment  # the idle rest of it is ordinary space


def test_idle_segments_are_evicted_to_make_room(cluster):
    with Arena(cluster, segment_size=64 << 10, capacity=512 << 10) as arena:
        smalls = [arena.try_write(make_part(i, 900)) for i in range(8)]  # ~54 KiB each
        assert len(arena.segments) == 8
        for ref in smalls[1:]:
            arena.release(ref)
        big = arena.try_write(make_part(9, 5000))  # ~300 KiB: needs 5 idle segments gone
        assert big is not None
        retired = arena.take_retired()
        assert len(retired) == 5 and smalls[0].segment not in retired
        assert arena.mapped_bytes <= arena.capacity
        assert arena.take_retired() == []


def test_a_part_larger_than_the_arena_waits_for_an_empty_arena(cluster):
    with Arena(cluster, segment_size=64 << 10, capacity=128 << 10) as arena:
        small = arena.try_write(make_part(0, 100))
        huge = make_part(1, 4000)  # ~240 KiB > capacity
        assert arena.try_write(huge) is None
        arena.release(small)
        ref = arena.try_write(huge)
        assert ref is not None and arena.outstanding == 1
        with SegmentReader(cluster) as reader:
            assert part_number(reader.read(ref)) == 1


def test_release_rejects_what_is_not_outstanding(cluster):
    with Arena(cluster) as arena:
        ref = arena.try_write(make_part(0, 10))
        arena.release(ref)
        with pytest.raises(ValueError, match="not outstanding"):
            arena.release(ref)


def test_close_is_idempotent_and_unlinks_everything(cluster):
    arena = Arena(cluster, segment_size=64 << 10, capacity=1 << 20)
    for i in range(4):
        arena.try_write(make_part(i, 900))
    names = arena.segments
    assert len(names) == 4
    arena.close()
    arena.close()
    assert list_segments(cluster) == []
    assert sorted(arena.take_retired()) == sorted(names)
    with pytest.raises(ValueError, match="closed"):
        arena.try_write(make_part(0, 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"segment_size": 1000}, "multiple of"),
        ({"segment_size": 0}, "multiple of"),
        ({"segment_size": 1 << 20, "capacity": 1 << 19}, "below segment_size"),
    ],
)
def test_bad_arena_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Arena("c", **kwargs)


@pytest.mark.parametrize("bad", ["", "a.b", "x" * 41, "sp ace", "a/b"])
def test_bad_cluster_ids_are_refused(bad):
    with pytest.raises(ValueError, match="invalid cluster id"):
        Arena(bad)
