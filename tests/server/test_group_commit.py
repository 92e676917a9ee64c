"""Group commit in the consensus server: the queue and the window as plain
state, and batches of many shards' commands through a server whose store
counts, holds and fails its ``compare_and_set_many`` calls."""

from __future__ import annotations

import threading
import time

import pytest

from shardsink import open_shard
from shardsink.persist import ShardConfig
from shardsink.persist.commands import HeartbeatWriter
from shardsink.server.group_commit import (
    OWN,
    WINDOW_FRACTION,
    WINDOW_START_S,
    BatchWindow,
    CommandQueue,
    OwnCommands,
    Queued,
)
from shardsink.storage import Mismatch, open_blob, open_consensus
from shardsink.storage.errors import DeterminateError, IndeterminateError, StorageError
from shardsink.workloads import Workload
from tests.helpers.server import serving as helpers_serving
from tests.helpers.wait import wait_until

WORKLOAD = Workload("churn", rows_per_interval=4, interval_ms=1)


def queued(shard: str, n: int) -> Queued:
    return Queued(b"peer", n.to_bytes(8, "big"), shard, HeartbeatWriter(f"w{n}"), float(n))


def test_a_batch_takes_the_oldest_command_of_each_shard_in_order() -> None:
    queue = CommandQueue()
    for n, shard in enumerate(["a", "b", "a", "c", "a", "b"]):
        queue.put(queued(shard, n))
    assert len(queue) == 3
    first = queue.take(2)
    assert [(q.shard, q.command.writer_id) for q in first] == [("a", "w0"), ("b", "w1")]
    # c waited longest now; a and b went to the back
    assert [(q.shard, q.command.writer_id) for q in queue.take(10)] == [
        ("c", "w3"),
        ("a", "w2"),
        ("b", "w5"),
    ]
    assert [q.command.writer_id for q in queue.take(10)] == ["w4"]
    assert len(queue) == 0 and queue.take(10) == []


def test_the_window_grows_from_small_to_its_share_of_the_latency_and_back() -> None:
    window = BatchWindow(max_s=0.002)
    assert window.seconds == 0.0
    window.committed(8, 0.001)
    assert window.seconds == WINDOW_START_S
    seen = [window.seconds]
    for _ in range(10):
        window.committed(8, 0.001)
        seen.append(window.seconds)
    assert seen == sorted(seen) and seen[-1] == pytest.approx(WINDOW_FRACTION * 0.001)
    for _ in range(20):  # slow commits: bounded by max_s
        window.committed(8, 0.1)
    assert window.seconds == 0.002
    for _ in range(20):  # one client alone: no waiting for company
        window.committed(1, 0.001)
    assert window.seconds == 0.0
    window.committed(8, 0.001)
    window.idle()
    assert window.seconds == 0.0
    never = BatchWindow(max_s=0.0)
    never.committed(8, 0.01)
    assert never.seconds == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        BatchWindow(-1.0)


class GateStore:
    """A consensus store whose ``compare_and_set_many`` is recorded (the
    shards of each batch), may be held until :attr:`release` is set, and
    fails as :attr:`plan` says: ``("mismatch", shard)`` answers that shard's
    request with a mismatch, ``("determinate", None)`` fails the batch before
    it is stored, ``("indeterminate", None)`` after."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.batches: list[list[str]] = []
        self.hold = False
        self.held = threading.Event()
        self.release = threading.Event()
        self.plan: list[tuple[str, str | None]] = []
        self.singles: list[str] = []  # shards of compare_and_set calls, outside any batch

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def compare_and_set(self, shard, expected, new):
        self.singles.append(shard)
        return self.inner.compare_and_set(shard, expected, new)

    def compare_and_set_many(self, requests):
        self.batches.append([r.shard for r in requests])
        if self.hold:
            self.hold = False
            self.held.set()
            assert self.release.wait(30)
        fault = self.plan.pop(0) if self.plan else None
        if fault == ("determinate", None):
            raise DeterminateError("injected: nothing stored")
        results = self.inner.compare_and_set_many(requests)
        if fault == ("indeterminate", None):
            raise IndeterminateError("injected: stored, but the reply was lost")
        if fault is not None:
            return [
                Mismatch(self.inner.head(r.shard)) if r.shard == fault[1] else result
                for r, result in zip(requests, results, strict=True)
            ]
        return results


def _append_concurrently(address: str, blob: str, shards: list[str], rounds: int, go=None):
    """One thread per shard appending ``rounds`` batches; the uppers reached."""
    uppers: dict[str, int] = {}
    errors: list[BaseException] = []
    opened = [open_shard(s, blob=blob, consensus=address, create=True) for s in shards]
    writers = [shard.writer() for shard in opened]

    def append(i: int) -> None:
        try:
            if go is not None:
                go.wait(30)
            upper = 0
            for _ in range(rounds):
                upper = writers[i].compare_and_append_table(
                    WORKLOAD.updates(upper), upper, upper + 1
                )
            uppers[shards[i]] = upper
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(len(shards))]
    try:
        for t in threads:
            t.start()
        yield
        for t in threads:
            t.join(60)
    finally:
        for shard in opened:
            shard.close()
    assert not errors, errors
    assert uppers == dict.fromkeys(shards, rounds)


@pytest.fixture
def gate(tmp_path):
    return GateStore(open_consensus(f"sqlite://{tmp_path}/c.db"))


def serving(tmp_path, store, **options):
    """A server on ``store`` (closed with it) in a thread until the block ends."""
    return helpers_serving(
        tmp_path, open_blob(f"file://{tmp_path}/blob"), consensus=store, **options
    )


def _read_back(tmp_path, address: str, shard: str):
    with open_shard(
        shard, blob=f"file://{tmp_path}/blob", consensus=address, create=True
    ) as opened:
        return opened.reader().snapshot()


def test_commands_queued_behind_a_commit_are_stored_in_one_batch(tmp_path, gate) -> None:
    blob = f"file://{tmp_path}/blob"
    shards = [f"s{i}" for i in range(8)]
    with serving(tmp_path, gate) as server:
        go = threading.Event()
        appending = _append_concurrently(server.address, blob, shards, 5, go)
        next(appending)
        gate.hold = True
        go.set()
        assert gate.held.wait(30)
        # a grace for the other shards' first appends to queue behind the held commit: they
        # wait in the loop's socket, which nothing outside the server can see
        time.sleep(1.0)
        gate.release.set()
        next(appending, None)
        assert max(len(b) for b in gate.batches) >= 2
        assert all(len(b) == len(set(b)) for b in gate.batches)  # one command per shard
        for shard in shards:
            assert _read_back(tmp_path, server.address, shard).equals(WORKLOAD.expected(5))


@pytest.mark.parametrize(
    "fault", [("mismatch", "s3"), ("determinate", None), ("indeterminate", None)]
)
def test_a_failed_commit_fails_no_request_and_duplicates_nothing(tmp_path, gate, fault) -> None:
    """A mismatch sends only its shard's machine back to its own run; a batch
    that failed (stored or not) sends each, and every append lands once."""
    blob = f"file://{tmp_path}/blob"
    shards = [f"s{i}" for i in range(6)]
    with serving(tmp_path, gate, compact_interval_s=0) as server:
        go = threading.Event()
        appending = _append_concurrently(server.address, blob, shards, 4, go)
        next(appending)
        gate.hold = True
        go.set()
        assert gate.held.wait(30)
        # as above: a grace for the other appends to reach the held loop (nothing tells)
        time.sleep(1.0)
        gate.plan = [fault, fault]  # the held batch (one shard) and the one behind it
        gate.release.set()
        next(appending, None)
        counters = {c.shard: c for c in server.stats().shards}
        for shard in shards:  # every append once: the rows as written, none twice
            assert _read_back(tmp_path, server.address, shard).equals(WORKLOAD.expected(4))
    if fault[0] == "mismatch":
        assert counters["s3"].machine.cas_mismatches >= 1
        assert all(counters[s].machine.cas_mismatches == 0 for s in shards if s != "s3")


def test_own_commands_are_answered_by_the_loop_and_refused_once_closed() -> None:
    own = OwnCommands()
    results: list = []
    asker = threading.Thread(target=lambda: results.append(own.submit("s", HeartbeatWriter("w"))))
    asker.start()
    taken = wait_until(own.take, 10, "the asker's command, taken")
    assert [(i.peer, i.shard) for i in taken] == [(OWN, "s")] and own.take() == []
    own.answer(taken[0], "done")
    asker.join(10)
    assert results == ["done"]
    failing = threading.Thread(target=lambda: results.append(_raised(own)))
    failing.start()
    wait_until(lambda: own._waiting, 10, "a submit waiting for its answer")
    own.close()  # what waits fails; what comes next is refused at once
    failing.join(10)
    assert "closing" in str(results[-1]) and "closing" in str(_raised(own))


def _raised(own: OwnCommands) -> BaseException | None:
    try:
        own.submit("s", HeartbeatWriter("w"), timeout_s=10)
    except StorageError as exc:
        return exc
    return None


def test_compactions_are_stored_in_the_loops_batches(tmp_path, gate) -> None:
    """The merge lanes' compactions go through the loop's group commit: none
    is stored by a compare-and-set of its own."""
    blob = f"file://{tmp_path}/blob"
    # no heartbeat of the server's writer meanwhile, nor a rollup (a CaS of its own)
    quiet = ShardConfig(writer_lease_ms=600_000, rollup_threshold=1_000_000)
    with (
        serving(tmp_path, gate, compact_slack=2, config=quiet) as server,
        open_shard("s", blob=blob, consensus=server.address, create=True) as shard,
    ):
        writer = shard.writer()
        upper = writer.compare_and_append_table(WORKLOAD.updates(0), 0, 1)
        del gate.singles[:]
        while _compactions(server) < 3 and upper < 2000:
            upper = writer.compare_and_append_table(WORKLOAD.updates(upper), upper, upper + 1)
        assert _compactions(server) >= 3
        assert gate.singles == []
        assert shard.reader().snapshot().equals(WORKLOAD.expected(upper))


def _compactions(server) -> int:
    return sum(s.compactions for s in server.stats().shards)
