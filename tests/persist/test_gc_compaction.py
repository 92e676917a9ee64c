"""Garbage collection, the leaked-blob sweep, rollups and compaction."""

from __future__ import annotations

import itertools
import os
import time

import msgspec
import pytest

from shardsink import open_shard
from shardsink.persist import ShardConfig
from shardsink.persist.commands import ExpireWriter
from shardsink.persist.compaction import plan
from shardsink.persist.errors import CorruptState
from shardsink.persist.gc import sweep_leaked_blobs
from shardsink.persist.maintenance import register_writer
from shardsink.persist.state import BlobPart, InlinePart, part_prefix
from shardsink.storage import open_blob
from tests.helpers.persist import interval_rows, memory_stores, rows_of, spine_pass, updates

ALL_BLOB = ShardConfig(inline_max_bytes=0)
#: A writer lease short enough for a test's fake clock to outlive, and the
#: shortest sweep grace it allows.
LEASE_MS = 60_000
SWEPT = ShardConfig(inline_max_bytes=0, writer_lease_ms=LEASE_MS, leaked_blob_grace_ms=LEASE_MS)


def snapshots(shard, times):
    with shard.reader() as r:
        return {t: rows_of(r.snapshot(t)) for t in times}


def test_compaction_merges_small_batches_and_keeps_every_snapshot(stores):
    blob, consensus = stores
    with open_shard("s", blob=blob, consensus=consensus, config=ALL_BLOB, create=True) as shard:
        w = shard.writer()
        for i in range(6):
            w.compare_and_append_table(interval_rows(i, range(i, i + 3)), i, i + 1)
        w.compare_and_append_table(interval_rows(6, range(0, 4), diff=-1), 6, 7)
        before = snapshots(shard, range(7))
        report = shard.compact()
        assert (report.applied, report.batches_merged) == (1, 7)
        (merged,) = shard.state().batches.values()
        assert (merged.lower, merged.upper, len(merged.parts)) == (0, 7, 1)
        assert snapshots(shard, range(7)) == before
        assert shard.stats().compactions == 1


def test_compaction_forwards_to_since_and_cancels_retractions(stores):
    blob, consensus = stores
    with open_shard("s", blob=blob, consensus=consensus, create=True) as shard:
        w = shard.writer()
        w.compare_and_append_table(interval_rows(0, range(10)), 0, 1)
        w.compare_and_append_table(interval_rows(1, range(8), diff=-1), 1, 2)
        w.compare_and_append([], 2, 3)
        before = snapshots(shard, [2])
        shard.advance_since(2)
        shard.compact()
        (merged,) = shard.state().batches.values()
        assert merged.rows == 2  # 10 inserts and 8 retractions merged forward to ts 2
        assert snapshots(shard, [2]) == before


def test_compaction_leaves_big_batches_alone():
    blob, consensus = memory_stores()
    config = ShardConfig(inline_max_bytes=0, blob_target_bytes=4000)
    with open_shard("s", blob=blob, consensus=consensus, config=config, create=True) as shard:
        w = shard.writer()
        w.compare_and_append_table(interval_rows(0, [0]), 0, 1)
        w.compare_and_append_table(interval_rows(1, range(1, 400)), 1, 2)
        w.compare_and_append_table(interval_rows(2, [500]), 2, 3)
        w.compare_and_append_table(interval_rows(3, [501]), 3, 4)
        big = [b for b in shard.state().batches.values() if b.encoded_bytes >= 2000]
        assert len(big) == 1 and big[0].lower == 1
        (run,) = plan(shard.state(), 4000)
        assert [b.lower for b in run] == [2, 3]


def test_compaction_that_loses_its_inputs_commits_nothing(stores):
    blob_uri, consensus = stores
    blob = open_blob(blob_uri)
    try:
        a = open_shard("s", blob=blob, consensus=consensus, config=ALL_BLOB, create=True)
        b = open_shard("s", blob=blob_uri, consensus=consensus, config=ALL_BLOB, create=True)
        with a, b:
            w = a.writer()
            for i in range(3):
                w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
            before = snapshots(a, [2])
            original_get = blob.get

            def racing_get(key):
                blob.get = original_get
                assert b.compact().applied == 1  # b wins while a is merging
                return original_get(key)

            blob.get = racing_get
            report = a.compact()
            assert (report.applied, report.skipped) == (0, 1)
            state = a.state(refresh=True)
            assert len(state.batches) == 1 and snapshots(a, [2]) == before
            # a deleted its refused output itself (its writer, gone now, left
            # nothing for the sweep): what is in blob is b's output and the
            # inputs b retired
            parts = {k for k in state.referenced_keys() if k.startswith("s/part/")}
            assert set(blob.list("s/part/")) == parts and len(parts) == 4
            assert set(state.writers) == {w.writer_id}  # both compaction writers left
            assert snapshots(a, [2]) == before
    finally:
        blob.close()


def _three_blob_batches(shard):
    w = shard.writer()
    for i in range(3):
        w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
    return [k for b in shard.state().ordered_batches() for k in b.blob_keys()]


def test_compaction_meeting_a_corrupt_part_names_it_and_commits_nothing(tmp_path):
    blob_uri, consensus = f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/c.db"
    with open_shard("s", blob=blob_uri, consensus=consensus, config=ALL_BLOB, create=True) as shard:
        keys = _three_blob_batches(shard)
        blob = open_blob(blob_uri)
        try:
            blob.set(keys[1], b"PAR1 this is not parquet PAR1")
        finally:
            blob.close()
        merger = register_writer(shard.machine, "merger")
        seqno = shard.state(refresh=True).seqno
        with pytest.raises(CorruptState, match=f"shard 's': part {keys[1]}"):
            spine_pass(shard, target_bytes=1 << 20, writer_id=merger)
        assert shard.state(refresh=True).seqno == seqno
        assert list(shard.blob.list(part_prefix("s", merger))) == []  # what it wrote is deleted


def test_a_merge_of_inline_parts_meeting_a_corrupt_one_names_it_and_commits_nothing():
    """Inline runs are merged decoded whole (no key windows): a part that does
    not decode is still named, and nothing is committed."""
    blob, consensus = memory_stores()
    with open_shard("s", blob=blob, consensus=consensus, create=True) as shard:
        w = shard.writer()
        for i in range(3):
            batch = w.batch(interval_rows(i, [i, 10 + i]), i, i + 1)
            if i == 1:
                part = batch.parts[0]
                broken = msgspec.structs.replace(part, data=part.data[:-3] + b"xyz")
                batch = msgspec.structs.replace(batch, parts=(broken,))
            w.compare_and_append([batch], i, i + 1)
        before = shard.state(refresh=True)
        assert all(isinstance(p, InlinePart) for b in before.batches.values() for p in b.parts)
        with pytest.raises(CorruptState, match="shard 's': inline part"):
            spine_pass(shard, target_bytes=1 << 20)
        assert shard.state(refresh=True).batches == before.batches


def test_spine_compaction_whose_input_is_gone_commits_nothing_and_leaves_no_output(tmp_path):
    blob_uri, consensus = f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/c.db"
    with open_shard("s", blob=blob_uri, consensus=consensus, config=ALL_BLOB, create=True) as shard:
        keys = _three_blob_batches(shard)
        shard.blob.delete(keys[2])
        merger = register_writer(shard.machine, "merger")
        seqno = shard.state(refresh=True).seqno
        report = spine_pass(shard, target_bytes=1 << 20, writer_id=merger)
        assert (report.applied, report.skipped) == (0, 1)
        assert shard.state(refresh=True).seqno == seqno
        # the merge stopped at the missing part and deleted what it had written
        assert sorted(shard.blob.list("s/part/")) == sorted(keys[:2])


@pytest.mark.parametrize("refusal", ["inputs taken", "writer expired"])
def test_a_refused_compaction_deletes_its_output_itself(tmp_path, refusal):
    """A merge whose commit is refused deletes its output parts itself: the
    sweep spares a part for as long as its writer is registered (a server's
    is for days), and takes that of a writer gone only after the grace."""
    blob_uri, consensus = f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/c.db"
    with open_shard("s", blob=blob_uri, consensus=consensus, config=ALL_BLOB, create=True) as shard:
        keys = _three_blob_batches(shard)
        merger = register_writer(shard.machine, "merger")
        original_get = shard.blob.get

        def racing_get(key):
            shard.blob.get = original_get
            if refusal == "inputs taken":
                assert shard.compact().applied == 1  # another merge wins meanwhile
            else:
                shard.machine.run(ExpireWriter(merger))
            return original_get(key)

        shard.blob.get = racing_get
        report = spine_pass(shard, target_bytes=1 << 20, writer_id=merger)
        assert (report.applied, report.skipped) == (0, 1)
        state = shard.state(refresh=True)
        assert (merger in state.writers) == (refusal == "inputs taken")
        assert list(shard.blob.list(part_prefix("s", merger))) == []
        parts = {k for k in state.referenced_keys() if k.startswith("s/part/")}
        assert set(shard.blob.list("s/part/")) == parts and set(keys) <= parts
        assert rows_of(shard.snapshot()) == [(i, format(i, "032x"), 2, 1) for i in range(3)]


def test_gc_respects_holds_until_the_lease_expires():
    now = [0]
    blob, consensus = memory_stores()
    opts = {"blob": blob, "consensus": consensus, "config": ALL_BLOB, "clock": lambda: now[0]}
    with open_shard("s", **opts, create=True) as shard:
        w = shard.writer()
        for i in range(3):
            w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
        keys = {k for b in shard.state().batches.values() for k in b.blob_keys()}
        reader = shard.reader(lease_ms=1000)
        shard.compact()
        assert shard.collect_garbage().blobs_deleted == ()
        now[0] = 900
        reader.heartbeat()  # keeps the lease, not moving the hold
        now[0] = 1800
        assert shard.collect_garbage().blobs_deleted == ()
        now[0] = 3000
        report = shard.collect_garbage()
        assert report.readers_expired == (reader.reader_id,)
        assert set(report.blobs_deleted) == keys
        assert all(shard.blob.get(k) is None for k in keys)
        assert shard.state().retired == {}
        assert shard.collect_garbage().blobs_deleted == ()  # nothing left to do
        assert rows_of(reader.snapshot()) == [(i, format(i, "032x"), 2, 1) for i in range(3)]


def test_leaked_blob_sweep_deletes_only_old_unreferenced_blobs_of_gone_writers(stores):
    """The sweep takes a blob that no state references only once it is
    older than the grace (never shorter than the writer lease) and, for a
    writer's part, once its writer left state: here a writer that died
    before appending its batch, and expired."""
    blob, consensus = stores
    now = [1_000_000]
    opts = {"blob": blob, "consensus": consensus, "config": SWEPT, "clock": lambda: now[0]}
    with open_shard("s", **opts, create=True) as shard:
        w = shard.writer()
        w.compare_and_append_table(interval_rows(0, [1]), 0, 1)
        orphan = w.batch(interval_rows(1, [2]), 1, 2)  # a writer that died before appending
        (key,) = orphan.blob_keys()
        assert key.startswith(part_prefix("s", w.writer_id))
        with pytest.raises(ValueError, match=f"shorter than the writer lease \\({LEASE_MS} ms\\)"):
            shard.sweep_leaked_blobs(grace_ms=LEASE_MS - 1)
        assert shard.sweep_leaked_blobs() == []  # younger than the grace

        def sweep_later() -> list[str]:
            """Sweep as if every blob had aged past the grace (a memory://
            blob's age is the wall clock's, so the sweep is told a later now)."""
            later = time.time() * 1000 + 2 * LEASE_MS
            return sweep_leaked_blobs(shard.machine, shard.blob, LEASE_MS, later)

        assert sweep_later() == []  # its writer is still in state: it may yet append it
        now[0] += LEASE_MS + 1  # the writer stops heartbeating: maintenance expires it
        assert shard.collect_garbage().writers_expired == (w.writer_id,)
        assert sweep_later() == [key]
        assert shard.blob.get(key) is None
        assert rows_of(shard.reader().snapshot()) == [(1, format(1, "032x"), 0, 1)]
        assert sweep_later() == []


def test_leaked_blob_sweep_removes_temp_files_of_writers_killed_mid_set(tmp_path):
    root = tmp_path / "blob"
    consensus = f"sqlite://{tmp_path}/consensus.db"
    with open_shard(
        "s", blob=f"file://{root}", consensus=consensus, config=SWEPT, create=True
    ) as shard:
        live = shard.writer()
        live.compare_and_append_table(interval_rows(0, [1]), 0, 1)
        # what a writer killed mid-set leaves: KEY~PID-HEX beside where KEY would be
        dead = "s/part/dead.7/a.parquet~4242-0123456789ab"  # of a writer gone from state
        busy = "s/part/dead.7/b.parquet~4243-0123456789ab"  # the same, younger than the grace
        legacy = "s/part/c.parquet~4244-0123456789ab"  # of a version before writer prefixes
        held = f"{part_prefix('s', live.writer_id)}d.parquet~4245-0123456789ab"  # a live one's
        others = "t/part/x~1-0a"  # another shard's
        for name in (dead, busy, legacy, held, others):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(b"partial")

        def age(*names: str) -> None:
            past_grace = time.time() - LEASE_MS / 1000 - 60
            for name in names:
                os.utime(root / name, (past_grace, past_grace))

        age(dead, legacy, held, others)
        assert sorted(shard.sweep_leaked_blobs()) == sorted([dead, legacy])
        assert (root / busy).exists()  # younger than the grace
        age(busy)
        assert shard.sweep_leaked_blobs() == [busy]
        assert (root / held).exists()  # its writer may still be writing it
        live.close()
        assert shard.sweep_leaked_blobs() == [held]
        assert not any((root / name).exists() for name in (dead, busy, legacy, held))
        assert (root / others).exists()
        assert rows_of(shard.reader().snapshot()) == [(1, format(1, "032x"), 0, 1)]


def test_rollups_every_threshold_versions_and_old_ones_collected(stores):
    blob, consensus = stores
    config = ShardConfig(rollup_threshold=5)
    with open_shard("s", blob=blob, consensus=consensus, config=config, create=True) as shard:
        w = shard.writer()
        for i in range(30):
            w.compare_and_append_table(updates([(i, "v", i, 1)]), i, i + 1)
        state = shard.state()
        assert len(state.rollups) >= 5
        seqnos = sorted(state.rollups)
        assert all(b - a >= 5 for a, b in itertools.pairwise(seqnos))
        assert shard.stats().rollup_puts == len(state.rollups)  # version 0's included
        shard.collect_garbage()
        shard.collect_garbage()  # the first retired the old rollups; this deletes them
        state = shard.state()
        assert len(state.rollups) <= 2  # GC's own versions may have added one
        assert set(shard.blob.list("s/rollup/")) == {r.key for r in state.rollups.values()}


def test_inspect_reports_parts_and_bytes():
    blob, consensus = memory_stores()
    with open_shard("s", blob=blob, consensus=consensus, create=True) as shard:
        w = shard.writer()
        w.compare_and_append_table(interval_rows(0, [1]), 0, 1)
        w.compare_and_append_table(interval_rows(1, range(2, 900)), 1, 2)
        info = shard.inspect()
        state = shard.state()
        blob_part = next(
            p for b in state.batches.values() for p in b.parts if isinstance(p, BlobPart)
        )
        assert info["upper"] == 2 and info["batches"] == 2 and info["parts"] == 2
        assert info["inline_parts"] == 1 and info["inline_bytes"] == state.inline_bytes > 0
        assert info["blob_bytes"] == blob_part.encoded_bytes and info["rows"] == 899
        assert list(info["writers"]) == [w.writer_id]


def test_truncation_refuses_to_strand_versions():
    blob, consensus = memory_stores()
    config = ShardConfig(rollup_threshold=3)
    with open_shard("s", blob=blob, consensus=consensus, config=config, create=True) as shard:
        w = shard.writer()
        for i in range(10):
            w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
        rollups = sorted(shard.state().rollups)
        with pytest.raises(ValueError, match="no rollup at seqno"):
            shard.machine.truncate_below(rollups[1] + 1)
        assert shard.machine.truncate_below(rollups[1]) == rollups[1]
        assert shard.machine.truncate_below(0) == 0  # below the oldest rollup: harmless
