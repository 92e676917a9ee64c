"""Expiry and retention by the consensus server's maintenance: a writer whose
process died leaves state within its lease, a live coordinator heartbeats
through intervals longer than its lease, a reader that stops heartbeating
stops holding back GC, since trails the upper by ``retain`` unless a live
reader holds it back, and the spine's merges run off the request loop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from shardsink import open_shard
from shardsink.persist import spine
from shardsink.persist.config import ShardConfig
from shardsink.persist.errors import NotReadable
from shardsink.process import ConsensusProcess
from shardsink.server import ServerClient
from shardsink.server.config import ServeConfig
from shardsink.storage import open_blob
from shardsink.workloads import Workload
from tests.helpers.server import serving, settled_spine
from tests.helpers.wait import wait_until

LEASE_MS = 1500
WORKLOAD = Workload("trickle", rows_per_interval=16, interval_ms=1)


def _inspect(consensus: str, blob: str) -> dict:
    """``shard inspect --json``; no writers before the cluster creates the shard."""
    argv = [sys.executable, "-m", "shardsink.cli", "shard", "inspect", "--json"]
    argv += ["--consensus", consensus, "--blob", blob]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "does not exist" in done.stderr:
        return {"writers": {}}
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _writers(consensus: str, blob: str) -> set[str]:
    return set(_inspect(consensus, blob)["writers"])


def _own(server: ConsensusProcess, writers: set[str]) -> set[str]:
    """The writers the server registered itself (one a shard, for its
    compactions: ``consensus-<pid>-...``)."""
    (pid,) = server.pids()
    return {w for w in writers if w.startswith(f"consensus-{pid}-")}


def test_a_killed_coordinators_writer_leaves_state_within_its_lease(tmp_path, popen) -> None:
    blob = f"file://{tmp_path}/blob"
    server = ConsensusProcess(
        f"sqlite://{tmp_path}/c.db",
        blob,
        ServeConfig(bind=f"ipc://{tmp_path}/sock/c", writer_lease_ms=LEASE_MS),
    )
    with server:
        # intervals of 4 s: the coordinator appends less often than its lease,
        # so only its heartbeats keep its writer
        argv = [sys.executable, "-m", "shardsink.cli", "up", "--data-dir", str(tmp_path / "d")]
        argv += ["--consensus", server.address, "--blob", blob, "--groups", "1"]
        argv += ["--workers", "1", "--rows-per-interval", "8", "--interval-ms", "4000"]
        argv += ["--pace", "realtime", "--intervals", "1000"]
        # an append is retried for at most two thirds of the lease (up refuses more)
        argv += ["--append-retry-s", str(LEASE_MS * 2 / 3 / 1000)]
        up = popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def registered() -> set[str] | None:
            assert up.poll() is None, up.stderr.read().decode()
            writers = _writers(server.address, blob)
            return writers if writers - _own(server, writers) else None

        # each look runs ``shard inspect``: at most one a 0.2 s
        writers = wait_until(registered, 60, "the coordinator's writer", every_s=0.2)
        (own,) = _own(server, writers)
        (writer,) = writers - {own}
        with open_shard(blob=blob, consensus=server.address, create=False) as shard:
            seen_until = time.monotonic() + 3 * LEASE_MS / 1000
            while time.monotonic() < seen_until:
                writers = shard.state(refresh=True).writers
                assert writer in writers, "a live coordinator's writer expired"
                time.sleep(0.05)  # a look every 50 ms through three leases: it must stay all along
            os.kill(up.pid, signal.SIGKILL)
            killed = time.monotonic()
            wait_until(  # a look every 20 ms: the time to expiry is measured
                lambda: writer not in shard.state(refresh=True).writers,
                10,
                "the expiry of the dead coordinator's writer",
                every_s=0.02,
            )
            gone_after_s = time.monotonic() - killed
        up.wait(10)
        # only the server's own writer is left: the same one all along, several
        # leases on, which its heartbeats kept
        assert _writers(server.address, blob) == {own}
    # last seen at most a third of a lease before the kill, and expiry runs
    # every tenth of one: gone within the lease (plus scheduling slack)
    assert gone_after_s <= LEASE_MS / 1000 + 0.3


def test_a_reader_that_stops_heartbeating_stops_holding_back_gc(tmp_path) -> None:
    """GC keeps what a leased reader holds for as long as its lease lasts, on
    the server's clock (a fake one here, so no scheduling delay decides), and
    lets it go once the lease ran out."""
    blob_uri = f"file://{tmp_path}/blob"
    config = ShardConfig(inline_max_bytes=0)  # every part in blob, so compaction retires blobs
    now = [10_000_000]
    with (
        serving(tmp_path, open_blob(blob_uri), gc_interval_s=0.05, clock=lambda: now[0]) as server,
        open_shard(
            "g", blob=blob_uri, consensus=server.address, config=config, create=True
        ) as shard,
    ):
        writer = shard.writer()
        for i in range(4):
            writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
        held = set(shard.blob.list("g/part/"))
        reader = shard.reader(lease_ms=1000)  # then never heartbeats again
        assert shard.compact().applied == 1
        runs = _gc_runs(server)
        now[0] += 999  # the last moment of the lease
        # GC runs inside the lease: the hold keeps the parts
        wait_until(lambda: _gc_runs(server) >= runs + 3, 30, "3 GC runs", every_s=0.02)
        assert held <= set(shard.blob.list("g/part/"))
        assert reader.reader_id in shard.state(refresh=True).readers
        now[0] += 2
        wait_until(
            lambda: not held & set(shard.blob.list("g/part/")),
            30,
            "GC of the parts an expired reader held",
        )
        assert reader.reader_id not in shard.state(refresh=True).readers
        assert shard.reader().snapshot().equals(WORKLOAD.expected(4))


def _gc_runs(server) -> int:
    return sum(counters.gc_runs for counters in server.stats().shards)


def test_maintenance_advances_since_by_retain_held_back_by_live_readers(tmp_path) -> None:
    blob_uri = f"file://{tmp_path}/blob"
    served = ShardConfig(writer_lease_ms=500, retain=3)  # expiry and retention every 50 ms

    def since_reaches(since: int) -> None:
        wait_until(
            lambda: shard.state(refresh=True).since == since,
            10,
            lambda: f"since {since} (it stayed at {shard.since})",
        )

    with (
        serving(tmp_path, open_blob(blob_uri), config=served) as server,
        open_shard("g", blob=blob_uri, consensus=server.address, create=True) as shard,
    ):
        writer = shard.writer()
        for i in range(5):
            writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
        since_reaches(2)
        reader = shard.reader(lease_ms=60_000)  # holds [2, 5): its version's window
        for i in range(5, 10):
            writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
        # several maintenance runs (every 50 ms), each a chance to advance since wrongly: a
        # wait for something that must not happen, which no signal ends
        time.sleep(0.3)
        assert shard.state(refresh=True).since == 2
        assert reader.snapshot(2).equals(WORKLOAD.expected(3))
        reader.close()
        since_reaches(7)
        with pytest.raises(NotReadable, match="since 7"):
            shard.reader().snapshot(6)
        assert shard.reader().snapshot(9).equals(WORKLOAD.expected(10))


def test_maintenance_merges_by_the_spine_while_appends_go_on(tmp_path) -> None:
    blob_uri = f"file://{tmp_path}/blob"
    with (
        serving(tmp_path, open_blob(blob_uri), compact_interval_s=0.05, compact_slack=1) as server,
        open_shard("g", blob=blob_uri, consensus=server.address, create=True) as shard,
    ):
        writer = shard.writer()
        for i in range(60):
            writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
        state = settled_spine(shard)
        assert len(state.batches) <= spine.batch_bound(state) < 60
        assert shard.reader().snapshot().equals(WORKLOAD.expected(60))
        client = ServerClient(server.address)
        try:
            (counters,) = client.stats().shards
        finally:
            client.close()
        # each merge replaces its inputs by one batch
        assert counters.compacted_batches - counters.compactions == 60 - len(state.batches)
        assert counters.compacted_batches >= 2 * counters.compactions
        assert counters.compactions_abandoned == 0


class _SlowReads:
    """A blob store whose reads wait until ``release`` is set, once ``gate``
    is set: a very slow store under compaction, which reads its inputs."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()

    def get(self, key):
        if self.gate.is_set():
            self.entered.set()
            assert self.release.wait(60), "test never released the gate"
        return self.inner.get(key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_slow_blob_store_under_compaction_does_not_stall_appends(tmp_path) -> None:
    blob_uri = f"file://{tmp_path}/blob"
    slow = _SlowReads(open_blob(blob_uri))
    config = ShardConfig(inline_max_bytes=0)  # every part in blob: compaction must read it
    with serving(tmp_path, slow, compact_interval_s=0.05, compact_slack=1) as server:
        try:
            with open_shard(
                "g", blob=blob_uri, consensus=server.address, config=config, create=True
            ) as shard:
                writer = shard.writer()
                slow.gate.set()
                for i in range(2):
                    writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
                assert slow.entered.wait(30), "compaction never read its inputs"
                # the maintenance thread waits on the store; appends do not
                for i in range(2, 20):
                    writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
                assert len(shard.state(refresh=True).batches) >= 19
                slow.release.set()
                state = settled_spine(shard)
                assert len(state.batches) <= spine.batch_bound(state)
                assert shard.reader().snapshot().equals(WORKLOAD.expected(20))
        finally:
            slow.release.set()
