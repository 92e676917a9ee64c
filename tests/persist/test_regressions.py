"""Deterministic regressions for the races the design names, each with a
precisely timed hook instead of random faults."""

from __future__ import annotations

import contextlib

import pytest

from shardsink import open_shard
from shardsink.persist import CorruptState, PartMissing, ShardConfig, UpperMismatch
from shardsink.storage import IndeterminateError, open_blob, open_consensus
from tests.helpers.persist import interval_rows, memory_stores, rows_of

ALL_BLOB = ShardConfig(inline_max_bytes=0)  # every part in blob


class HookedBlob:
    """A Blob that runs ``hook(key)`` once, before the first ``get`` of a part
    key, and counts gets per key."""

    def __init__(self, inner):
        self.inner = inner
        self.uri = inner.uri
        self.hook = None
        self.gets: dict[str, int] = {}

    def get(self, key):
        self.gets[key] = self.gets.get(key, 0) + 1
        if self.hook is not None and "/part/" in key:
            hook, self.hook = self.hook, None
            hook(key)
        return self.inner.get(key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class CommitThenFail:
    """A Consensus whose next ``fail`` compare-and-sets commit and then raise
    ``IndeterminateError`` (the reply was lost)."""

    def __init__(self, inner):
        self.inner = inner
        self.uri = inner.uri
        self.fail = 0

    def compare_and_set(self, shard, expected, new):
        result = self.inner.compare_and_set(shard, expected, new)
        if self.fail:
            self.fail -= 1
            raise IndeterminateError("reply lost after commit")
        return result

    def __getattr__(self, name):
        return getattr(self.inner, name)


class HookAfterHead:
    """A Consensus that runs ``hook()`` once, after its next ``head`` read and
    before returning it: between a machine's head read and its rebuild."""

    def __init__(self, inner):
        self.inner = inner
        self.uri = inner.uri
        self.hook = None

    def head(self, shard):
        head = self.inner.head(shard)
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return head

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def hooked(stores):
    """(hooked blob, blob URI, consensus URI); the blob is closed afterwards."""
    blob_uri, consensus_uri = stores
    blob = HookedBlob(open_blob(blob_uri))
    yield blob, blob_uri, consensus_uri
    blob.close()


def fill(shard, n, start=0):
    w = shard.writer()
    for i in range(start, start + n):
        w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
    w.close()


def test_a_gc_between_selection_and_fetch_cannot_delete_leased_parts(hooked):
    blob, blob_uri, consensus_uri = hooked
    with (
        open_shard("s", blob=blob, consensus=consensus_uri, config=ALL_BLOB, create=True) as shard,
        open_shard(
            "s", blob=blob_uri, consensus=consensus_uri, config=ALL_BLOB, create=True
        ) as other,
    ):
        fill(shard, 3)
        selected = {k for b in shard.state().batches.values() for k in b.blob_keys()}
        reader = shard.reader()
        seen = {}

        def compact_and_collect(key):
            # the reader has leased and selected; now its inputs are replaced and GC runs
            assert other.compact().applied == 1
            seen["gc"] = other.collect_garbage()
            seen["exists"] = {k: blob.inner.get(k) is not None for k in selected}

        blob.hook = compact_and_collect
        snap = reader.snapshot()
        assert rows_of(snap) == [(i, format(i, "032x"), 2, 1) for i in range(3)]
        assert seen["gc"].blobs_deleted == () and all(seen["exists"].values())
        assert shard.stats().part_refetches == 0
        reader.close()  # the hold goes: now the replaced parts are garbage
        assert set(other.collect_garbage().blobs_deleted) == selected


def test_a_reader_selects_from_the_version_it_leased_not_its_stale_cache(hooked):
    blob, blob_uri, consensus_uri = hooked
    with (
        open_shard("s", blob=blob, consensus=consensus_uri, config=ALL_BLOB, create=True) as shard,
        open_shard(
            "s", blob=blob_uri, consensus=consensus_uri, config=ALL_BLOB, create=True
        ) as other,
    ):
        fill(shard, 3)
        reader = shard.reader()
        old = {k for b in shard.state(refresh=False).batches.values() for k in b.blob_keys()}
        # behind the reader's back (its handle's cached state still lists the old
        # batches), another handle compacts them away
        assert other.compact().applied == 1
        fetched, deleted = [], []

        def collect(key):
            fetched.append(key)
            deleted.extend(other.collect_garbage().blobs_deleted)

        blob.hook = collect
        assert reader.snapshot().num_rows == 3
        # GC ran after the lease and deleted the replaced parts, which the reader
        # never selected: selecting from the stale cache before leasing would
        # have picked exactly those and found them gone
        assert set(deleted) == old
        assert fetched[0] not in old
        assert shard.stats().part_refetches == 0


def test_b_reclaimed_part_is_reread_from_refreshed_state(hooked):
    blob, blob_uri, consensus_uri = hooked
    now = [0]
    clock = lambda: now[0]  # noqa: E731
    with (
        open_shard(
            "s", blob=blob, consensus=consensus_uri, config=ALL_BLOB, clock=clock, create=True
        ) as shard,
        open_shard(
            "s", blob=blob_uri, consensus=consensus_uri, config=ALL_BLOB, clock=clock, create=True
        ) as gc,
    ):
        fill(shard, 3)
        reader = shard.reader(lease_ms=10)
        lost = []

        def reclaim(key):
            # the reader stalls past its lease: GC expires it and reclaims what it selected
            now[0] += 1000
            assert gc.compact().applied == 1
            lost.extend(gc.collect_garbage().blobs_deleted)

        blob.hook = reclaim
        assert reader.snapshot().num_rows == 3
        assert len(lost) == 3 and all(blob.inner.get(k) is None for k in lost)
        assert shard.stats().part_refetches == 1
        assert reader.reader_id in shard.state().readers  # registered again


def test_b_permanently_missing_part_raises_named_error(hooked):
    blob, _, consensus_uri = hooked
    with open_shard("s", blob=blob, consensus=consensus_uri, config=ALL_BLOB, create=True) as shard:
        fill(shard, 2)
        (key, *_) = shard.state().ordered_batches()[0].blob_keys()
        blob.inner.delete(key)
        with pytest.raises(PartMissing, match=f"'s'.*{key}.*3 reads") as info:
            shard.reader().snapshot()
        assert (info.value.shard, info.value.key) == ("s", key)
        assert blob.gets[key] == 3


def test_c_indeterminate_append_is_retried_inside_the_machine_and_appends_once(stores):
    blob_uri, consensus_uri = stores
    consensus = CommitThenFail(open_consensus(consensus_uri))
    try:
        with open_shard("s", blob=blob_uri, consensus=consensus, create=True) as shard:
            w = shard.writer()
            consensus.fail = 1
            assert w.compare_and_append_table(interval_rows(0, [1, 2]), 0, 1) == 1
            assert len(shard.state().batches) == 1 and shard.upper == 1
            assert shard.stats().indeterminate == 1 and shard.stats().appends == 1
            assert shard.reader().snapshot().num_rows == 2
    finally:
        consensus.close()


def test_c_caller_retry_after_indeterminate_error_succeeds_exactly_once(stores):
    blob_uri, consensus_uri = stores
    consensus = CommitThenFail(open_consensus(consensus_uri))
    try:
        config = ShardConfig(max_attempts=1)
        with open_shard(
            "s", blob=blob_uri, consensus=consensus, config=config, create=True
        ) as shard:
            w = shard.writer()
            batch = w.batch(interval_rows(0, [1]), 0, 1)
            consensus.fail = 1
            with pytest.raises(IndeterminateError):
                w.compare_and_append([batch], 0, 1)
            assert w.compare_and_append([batch], 0, 1) == 1  # same token: success
            with pytest.raises(UpperMismatch, match="actual upper 1"):
                w.compare_and_append([batch], 0, 1)  # a new call: the upper moved
            assert list(shard.state().batches) == [batch.id]
            assert rows_of(shard.reader().snapshot()) == [(1, format(1, "032x"), 0, 1)]
    finally:
        consensus.close()


def test_d_state_rebuilds_from_rollup_after_truncation(stores):
    blob_uri, consensus_uri = stores
    config = ShardConfig(rollup_threshold=4)
    with open_shard(
        "s", blob=blob_uri, consensus=consensus_uri, config=config, create=True
    ) as shard:
        stale = open_shard("s", blob=blob_uri, consensus=consensus_uri, config=config, create=True)
        fill(shard, 20)
        report = shard.collect_garbage()
        before = shard.state()
        assert report.versions_truncated > 0 and report.truncated_below > 0
        assert report.rollups_retired > 0
        consensus = open_consensus(consensus_uri)
        try:
            assert consensus.scan("s", 0, 1)[0].seqno == report.truncated_below
        finally:
            consensus.close()
        # a fresh handle rebuilds from the rollup plus the diffs after it
        with open_shard(
            "s", blob=blob_uri, consensus=consensus_uri, config=config, create=True
        ) as fresh:
            assert fresh.state(refresh=False) == before
            assert fresh.stats().rebuilds == 1
            assert rows_of(fresh.reader().snapshot()) == rows_of(shard.reader().snapshot())
        # a handle whose cached version was truncated away also rebuilds
        with stale:
            assert stale.state() == shard.state()
            assert stale.stats().rebuilds == 2


def test_d_truncation_keeps_versions_a_reader_holds_rebuildable():
    blob_uri, consensus_uri = memory_stores()
    config = ShardConfig(rollup_threshold=4)
    with open_shard(
        "s", blob=blob_uri, consensus=consensus_uri, config=config, create=True
    ) as shard:
        fill(shard, 5)
        reader = shard.reader()
        hold = shard.state().readers[reader.reader_id].seqno_hold
        fill(shard, 0)
        w = shard.writer()
        for i in range(5, 25):
            w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
        report = shard.collect_garbage()
        assert report.seqno_hold == hold
        assert report.truncated_below <= hold and report.truncated_below in shard.state().rollups


@pytest.mark.parametrize("gc_runs", [1, 2], ids=["versions-truncated", "rollup-deleted"])
@pytest.mark.parametrize("path", ["open", "refresh"])
def test_d_rebuild_rereads_the_head_when_gc_truncates_after_it_was_read(stores, path, gc_runs):
    blob_uri, consensus_uri = stores
    config = ShardConfig(rollup_threshold=4)
    with contextlib.ExitStack() as stack:
        consensus = HookAfterHead(open_consensus(consensus_uri))
        stack.callback(consensus.close)
        other = stack.enter_context(
            open_shard("s", blob=blob_uri, consensus=consensus_uri, config=config, create=True)
        )

        def open_late():
            return stack.enter_context(
                open_shard("s", blob=blob_uri, consensus=consensus, config=config, create=True)
            )

        fill(other, 3)
        late, rebuilds = None, 0
        if path == "refresh":
            late = open_late()
            rebuilds = late.stats().rebuilds
            fill(other, 2, start=other.upper)  # the head moves past the late handle's cache
        stale = other.state()
        reports = []

        def advance_and_collect():
            # the late handle has read the head; now rollups are written past it
            # and GC truncates below the newest (a second run also deletes the
            # rollup the stale head names)
            fill(other, 10, start=other.upper)
            reports.extend(other.collect_garbage() for _ in range(gc_runs))

        consensus.hook = advance_and_collect
        late = late or open_late()
        assert late.state() == other.state()
        # the race did happen, as the case says
        assert reports[0].truncated_below > stale.seqno
        deleted = {k for r in reports for k in r.blobs_deleted}
        assert (stale.latest_rollup().key in deleted) == (gc_runs == 2)
        # from the stale head, then from the new one
        assert late.stats().rebuilds - rebuilds == 2
        assert rows_of(late.reader().snapshot()) == rows_of(other.reader().snapshot())


def test_d_rebuild_at_a_head_that_did_not_move_reports_corruption(stores):
    blob_uri, consensus_uri = stores
    config = ShardConfig(rollup_threshold=4)
    with open_shard(
        "s", blob=blob_uri, consensus=consensus_uri, config=config, create=True
    ) as shard:
        fill(shard, 6)
        rollup = shard.state().latest_rollup()
        shard.blob.delete(rollup.key)
    with pytest.raises(CorruptState, match=f"rollup '{rollup.key}'.*missing"):
        open_shard("s", blob=blob_uri, consensus=consensus_uri, config=config, create=True)
