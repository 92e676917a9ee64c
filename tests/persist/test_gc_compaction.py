"""Garbage collection, the leaked-blob sweep, rollups and compaction."""

from __future__ import annotations

import itertools
import os
import time

import pytest
from persist_helpers import interval_rows, memory_stores, rows_of, updates

from shardsink import open_shard
from shardsink.persist import ShardConfig
from shardsink.persist.compaction import compact_spine, plan
from shardsink.persist.errors import CorruptState
from shardsink.persist.state import BlobPart
from shardsink.persist.stats import ShardStats
from shardsink.storage import open_blob

ALL_BLOB = ShardConfig(inline_max_bytes=0)


def snapshots(shard, times):
    with shard.reader() as r:
        return {t: rows_of(r.snapshot(t)) for t in times}


def test_compaction_merges_small_batches_and_keeps_every_snapshot(stores):
    blob, consensus = stores
    with open_shard("s", blob=blob, consensus=consensus, config=ALL_BLOB) as shard:
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
    with open_shard("s", blob=blob, consensus=consensus) as shard:
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
    with open_shard("s", blob=blob, consensus=consensus, config=config) as shard:
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
        a = open_shard("s", blob=blob, consensus=consensus, config=ALL_BLOB)
        b = open_shard("s", blob=blob_uri, consensus=consensus, config=ALL_BLOB)
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
            assert len(a.state().batches) == 1 and snapshots(a, [2]) == before
            # a's output was never referenced: the sweep finds exactly it
            leaked = a.sweep_leaked_blobs(grace_ms=0)
            assert len(leaked) == 1 and leaked[0].startswith("s/part/")
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
    with open_shard("s", blob=blob_uri, consensus=consensus, config=ALL_BLOB) as shard:
        keys = _three_blob_batches(shard)
        blob = open_blob(blob_uri)
        try:
            blob.set(keys[1], b"PAR1 this is not parquet PAR1")
        finally:
            blob.close()
        seqno = shard.state(refresh=True).seqno
        with pytest.raises(CorruptState, match=f"shard 's': part {keys[1]}"):
            compact_spine(shard.machine, shard.blob, target_bytes=1 << 20, stats=ShardStats())
        assert shard.state(refresh=True).seqno == seqno


def test_spine_compaction_whose_input_is_gone_commits_nothing_and_leaves_no_output(tmp_path):
    blob_uri, consensus = f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/c.db"
    with open_shard("s", blob=blob_uri, consensus=consensus, config=ALL_BLOB) as shard:
        keys = _three_blob_batches(shard)
        shard.blob.delete(keys[2])
        seqno = shard.state(refresh=True).seqno
        report = compact_spine(shard.machine, shard.blob, target_bytes=1 << 20, stats=ShardStats())
        assert (report.applied, report.skipped) == (0, 1)
        assert shard.state(refresh=True).seqno == seqno
        # the merge stopped at the missing part and deleted what it had written
        assert sorted(shard.blob.list("s/part/")) == sorted(keys[:2])


def test_gc_respects_holds_until_the_lease_expires():
    now = [0]
    blob, consensus = memory_stores()
    opts = {"blob": blob, "consensus": consensus, "config": ALL_BLOB, "clock": lambda: now[0]}
    with open_shard("s", **opts) as shard:
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


def test_leaked_blob_sweep_deletes_only_old_unreferenced_blobs(stores):
    blob, consensus = stores
    with open_shard("s", blob=blob, consensus=consensus, config=ALL_BLOB) as shard:
        w = shard.writer()
        w.compare_and_append_table(interval_rows(0, [1]), 0, 1)
        orphan = w.batch(interval_rows(1, [2]), 1, 2)  # a writer that died before appending
        assert shard.sweep_leaked_blobs() == []  # younger than the default grace
        assert shard.sweep_leaked_blobs(grace_ms=0) == orphan.blob_keys()
        assert rows_of(shard.reader().snapshot()) == [(1, format(1, "032x"), 0, 1)]
        assert shard.sweep_leaked_blobs(grace_ms=0) == []


def test_leaked_blob_sweep_removes_temp_files_of_writers_killed_mid_set(tmp_path):
    root = tmp_path / "blob"
    consensus = f"sqlite://{tmp_path}/consensus.db"
    with open_shard("s", blob=f"file://{root}", consensus=consensus, config=ALL_BLOB) as shard:
        shard.writer().compare_and_append_table(interval_rows(0, [1]), 0, 1)
        # what a writer killed mid-set leaves: KEY~PID-HEX beside where KEY would be
        names = ["s/part/dead~4242-0123456789ab", "s/part/busy~4243-0123456789ab"]
        others = "t/part/x~1-0a"  # another shard's
        for name in [*names, others]:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(b"partial")
        past_grace = time.time() - ShardConfig().leaked_blob_grace_ms / 1000 - 60
        for name in (names[0], others):
            os.utime(root / name, (past_grace, past_grace))
        assert shard.sweep_leaked_blobs() == names[:1]  # the other is younger than the grace
        assert shard.sweep_leaked_blobs(grace_ms=0) == names[1:]
        assert not any((root / name).exists() for name in names)
        assert (root / others).exists()
        assert rows_of(shard.reader().snapshot()) == [(1, format(1, "032x"), 0, 1)]


def test_rollups_every_threshold_versions_and_old_ones_collected(stores):
    blob, consensus = stores
    config = ShardConfig(rollup_threshold=5)
    with open_shard("s", blob=blob, consensus=consensus, config=config) as shard:
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
    with open_shard("s", blob=blob, consensus=consensus) as shard:
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
    with open_shard("s", blob=blob, consensus=consensus, config=config) as shard:
        w = shard.writer()
        for i in range(10):
            w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
        rollups = sorted(shard.state().rollups)
        with pytest.raises(ValueError, match="no rollup at seqno"):
            shard.machine.truncate_below(rollups[1] + 1)
        assert shard.machine.truncate_below(rollups[1]) == rollups[1]
        assert shard.machine.truncate_below(0) == 0  # below the oldest rollup: harmless
