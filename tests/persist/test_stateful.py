"""Random sequences of appends (with retractions), compactions, GC runs
(expiring the writer once it outlives its lease: a new one takes over),
leaked-blob sweeps, since advances, reader snapshots and listens, checked
against a plain in-memory model of the collection."""

from __future__ import annotations

import itertools
import time
from collections import Counter

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shardsink import open_shard
from shardsink.persist import NotReadable, ShardConfig, UpperMismatch
from shardsink.persist.errors import WriterExpired
from shardsink.persist.gc import sweep_leaked_blobs
from shardsink.persist.state import InlinePart, part_writer
from tests.helpers.persist import memory_stores, rows_of, updates

CONFIG = ShardConfig(
    rollup_threshold=3,
    inline_max_bytes=600,
    inline_total_max_bytes=2500,
    blob_target_bytes=3000,
    reader_lease_ms=1000,
    writer_lease_ms=1500,  # a GC run's advance of the clock may outlive it
    leaked_blob_grace_ms=1500,
)

update_rows = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from(["a", "b"]), st.integers(-2, 2)),
    max_size=40,
)


def consolidated(model: list[tuple], lower: int, upper: int, as_of: int | None = None):
    """The model's updates with ``lower <= ts < upper``, consolidated; with
    ``as_of``, all moved to that time."""
    sums: Counter = Counter()
    for key, val, ts, diff in model:
        if lower <= ts < upper:
            sums[(key, val, ts if as_of is None else as_of)] += diff
    return sorted((k, v, t, d) for (k, v, t), d in sums.items() if d)


class ShardModel(RuleBasedStateMachine):
    @initialize(seed=st.lists(update_rows, min_size=1, max_size=4))
    def open(self, seed):
        self.now = 0
        self.stores = memory_stores()
        self.shard = self.open_handle()
        self.writer = self.shard.writer()
        self.writer_seen = self.now  # when the shard last saw the writer
        self.abandoned: set[str] = set()  # blob keys of batches never appended
        self.reader = self.shard.reader()
        self.model: list[tuple] = []
        self.upper = 0
        self.since = 0
        self.listen_frontier = 0
        for i, rows in enumerate(seed):  # start from some data: runs are often short
            self.writer.compare_and_append_table(
                updates([(k, v, i, d) for k, v, d in rows]), i, i + 1
            )
            self.model.extend((k, v, i, d) for k, v, d in rows)
            self.upper = i + 1

    def writer_expired(self) -> bool:
        """Whether maintenance (GC) dropped the writer: its calls then raise
        WriterExpired, and it stays expired."""
        return self.writer.writer_id not in self.shard.state(refresh=True).writers

    def replace_expired_writer(self) -> None:
        old = self.writer
        self.writer = self.shard.writer(old.name)
        assert self.writer.writer_id != old.writer_id  # ids are never reused
        self.writer_seen = self.now

    def open_handle(self):
        blob, consensus = self.stores
        return open_shard(
            "s", blob=blob, consensus=consensus, config=CONFIG, clock=self.clock, create=True
        )

    def clock(self) -> int:
        return self.now

    def teardown(self):
        if hasattr(self, "shard"):
            self.shard.close()

    @rule(rows=update_rows, width=st.integers(1, 3), split=st.booleans(), data=st.data())
    def append(self, rows, width, split, data):
        lower, upper = self.upper, self.upper + width
        full = [(k, v, data.draw(st.integers(lower, upper - 1)), d) for k, v, d in rows]
        halves = [full[::2], full[1::2]] if split else [full]
        batches = [self.writer.batch(updates(h), lower, upper) for h in halves]
        if self.writer_expired():
            with pytest.raises(WriterExpired, match=self.writer.writer_id):
                self.writer.compare_and_append(batches, lower, upper)
            assert self.shard.state(refresh=True).upper == lower  # nothing appended
            self.replace_expired_writer()  # its batches' blobs are left to the sweep
            batches = [self.writer.batch(updates(h), lower, upper) for h in halves]
        assert self.writer.compare_and_append(batches, lower, upper) == upper
        self.writer_seen = self.now
        self.model.extend(full)
        self.upper = upper

    @rule(rows=st.integers(100, 300))
    def abandon_a_batch(self, rows):
        """A batch written and never appended (its writer changed its mind,
        or dies next): the sweep must spare its parts while the writer lives."""
        keys = [1000 + k for k in range(rows)]
        table = updates([(k, format(k * 2654435761 % 2**32, "08x"), self.upper, 1) for k in keys])
        batch = self.writer.batch(table, self.upper, self.upper + 1)
        assert batch.blob_keys()  # too big to go inline
        self.abandoned.update(batch.blob_keys())

    @rule(offset=st.integers(1, 3))
    def append_with_wrong_upper(self, offset):
        expected = self.upper + offset
        if self.writer_expired():  # gone is answered before the upper is compared
            with pytest.raises(WriterExpired):
                self.writer.compare_and_append_table(updates([]), expected, expected + 1)
            self.replace_expired_writer()
        with pytest.raises(UpperMismatch) as info:
            self.writer.compare_and_append_table(updates([]), expected, expected + 1)
        assert info.value.actual == self.upper

    @rule()
    def heartbeat(self):
        if self.writer_expired():
            with pytest.raises(WriterExpired):
                self.writer.heartbeat()
            self.replace_expired_writer()
        else:
            self.writer.heartbeat()
            self.writer_seen = self.now

    @rule()
    def compact(self):
        self.shard.compact()

    @rule(advance=st.integers(0, 2000))
    def collect_garbage(self, advance):
        # past its lease, the reader expires and later re-registers; the writer
        # expires and stays expired
        self.now += advance
        alive = not self.writer_expired()
        report = self.shard.collect_garbage()
        expires = alive and self.now > self.writer_seen + CONFIG.writer_lease_ms
        assert (self.writer.writer_id in report.writers_expired) == expires
        assert self.writer_expired() == (expires or not alive)

    @rule()
    def sweep(self):
        """As if every blob were older than the grace (a memory:// blob's age
        is the wall clock's, so the sweep is told a later now): it takes only
        unreferenced blobs of writers gone from state."""
        later = time.time() * 1000 + 2 * CONFIG.leaked_blob_grace_ms
        state = self.shard.state(refresh=True)
        swept = sweep_leaked_blobs(
            self.shard.machine, self.shard.blob, CONFIG.leaked_blob_grace_ms, later
        )
        assert not set(swept) & state.referenced_keys()
        assert not {part_writer("s", key) for key in swept} & state.writers.keys()
        live = {k for k in self.abandoned if part_writer("s", k) in state.writers}
        assert all(self.shard.blob.get(k) is not None for k in live)
        self.abandoned -= set(swept)
        # and every unreferenced part of a gone writer is gone now
        leaked = [
            key
            for key in self.shard.blob.list("s/part/")
            if key not in state.referenced_keys() and part_writer("s", key) not in state.writers
        ]
        assert leaked == []

    @precondition(lambda self: self.upper > 0)
    @rule(data=st.data())
    def advance_since(self, data):
        since = data.draw(st.integers(self.since, self.upper - 1))
        self.shard.advance_since(since)
        self.since = since

    @precondition(lambda self: self.upper > self.since)
    @rule(data=st.data())
    def snapshot(self, data):
        as_of = data.draw(st.integers(self.since, self.upper - 1))
        got = rows_of(self.reader.snapshot(as_of))
        assert got == consolidated(self.model, 0, as_of + 1, as_of)

    @precondition(lambda self: self.upper > 0)
    @rule()
    def snapshot_from_fresh_handle(self):
        with self.open_handle() as fresh:
            assert fresh.state(refresh=False) == self.shard.state()
            got = rows_of(fresh.snapshot())
        assert got == consolidated(self.model, 0, self.upper, self.upper - 1)

    @precondition(lambda self: self.upper > self.listen_frontier)
    @rule()
    def listen(self):
        frontier = self.listen_frontier
        if self.since > 0 and frontier <= self.since:
            with pytest.raises(NotReadable):
                next(self.reader.listen(since=frontier))
            self.listen_frontier = self.since + 1
            return
        events = list(self.reader.listen(since=frontier, until=self.upper))
        assert events[0].lower == frontier and events[-1].upper == self.upper
        assert all(a.upper == b.lower for a, b in itertools.pairwise(events))
        got = sorted(r for e in events for r in rows_of(e.updates))
        assert got == consolidated(self.model, frontier, self.upper)
        self.listen_frontier = self.upper

    @invariant()
    def state_is_consistent(self):
        if not hasattr(self, "shard"):
            return
        state = self.shard.state(refresh=False)
        inline = sum(
            len(p.data)
            for b in state.batches.values()
            for p in b.parts
            if isinstance(p, InlinePart)
        )
        assert state.inline_bytes == inline <= CONFIG.inline_total_max_bytes
        for batch in state.batches.values():
            for key in batch.blob_keys():
                assert self.shard.blob.get(key) is not None, key
        assert (state.upper, state.since) == (self.upper, self.since)


ShardModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_shard_matches_model = ShardModel.TestCase
