"""Leases across the emulated network: a writer cut off from the consensus
server past its lease is fenced, and a host's clock skewed ten minutes
either way neither extends nor shortens a lease, nor moves retention. The
consensus server judges leases by its own clock; these prove it with real
namespaces, real partitions (iptables) and real skew (libfaketime).

Writers run on their hosts (:mod:`tests.emulated.writer_on_host`); this
process reaches the server through the observer's port, as a chaos run's
readers do, and is the writer that takes over."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import shardsink
from shardsink._curve import KEYS_ENV
from shardsink.persist.config import ShardConfig
from shardsink.persist.errors import WriterExpired
from shardsink.testing.emulated import EmulatedCluster
from tests.emulated.writer_on_host import SCHEMA, rows
from tests.helpers.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
SHARD = "leases"
LEASE_MS = 3000
#: How long a line from a writer may take (a start imports pyarrow; an append
#: retried across a partition waits for its heal).
ANSWER_S = 60.0


class HostWriter:
    """A writer process on an emulated host (its module's protocol)."""

    def __init__(self, cluster: EmulatedCluster, host: int, name: str) -> None:
        argv = [sys.executable, "-m", "tests.emulated.writer_on_host", SHARD]
        argv += [cluster.consensus_address, name]
        self.cluster = cluster
        self.proc = cluster.popen_on(
            host,
            argv,
            env={**cluster.coordinator_env(), "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.writer_id = self.answer()["ready"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def send(self, request: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout_s: float = ANSWER_S) -> dict:
        try:
            return json.loads(self._lines.get(timeout=timeout_s))
        except queue.Empty:
            raise AssertionError(f"the writer on its host was silent {timeout_s:g} s") from None

    def append(self, lower: int, upper: int, first_key: int, n: int = 3) -> dict:
        self.send({"append": [lower, upper, first_key, n]})
        return self.answer()

    def status(self) -> dict:
        self.send({"status": True})
        return self.answer()

    def kill(self) -> None:
        """SIGKILL: it goes without forgetting its writer, as a crash does."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.cluster.stop(self.proc)


def _observer_shard(cluster: EmulatedCluster, monkeypatch):
    monkeypatch.setenv(KEYS_ENV, str(cluster.keys_dir))
    return shardsink.open_shard(
        SHARD,
        blob=cluster.blob,
        consensus=cluster.consensus_address,
        schema=SCHEMA,
        config=ShardConfig(server_timeout_s=2.0, server_retry_for_s=30.0),
    )


def _until_gone(shard, writer_id: str, timeout_s: float = 30.0) -> float:
    """Seconds until the server has expired ``writer_id``."""
    began = time.monotonic()
    wait_until(  # a look at least every 50 ms: the time is measured
        lambda: writer_id not in shard.state(refresh=True).writers,
        timeout_s,
        f"the expiry of {writer_id}",
        every_s=0.05,
    )
    return time.monotonic() - began


def test_a_writer_cut_off_past_its_lease_is_fenced(emulated_cluster, monkeypatch):
    """h0's writer appends, then is cut off from the consensus server (h1)
    with an append in flight; the server expires it after its lease and a
    writer here takes over; once healed, the old writer's append (its client
    still resending it) is refused, nothing it wrote is visible, and the new
    writer goes on."""
    cluster = emulated_cluster(
        2, observer=True, consensus_args=["--writer-lease-ms", str(LEASE_MS)]
    )
    old = HostWriter(cluster, 0, "old")
    assert old.append(0, 1000, 0) == {"outcome": "ok"}
    with _observer_shard(cluster, monkeypatch) as shard:
        cut = cluster.network.nemesis.partition(["h0"], ["h1"])
        old.send({"append": [1000, 2000, 100, 3]})  # in flight across the partition
        took = _until_gone(shard, old.writer_id)
        assert took >= LEASE_MS / 1000 - 1.0  # its last heartbeat came just before the cut
        new = shard.writer("new")
        new.compare_and_append_table(rows(1000, 200, 3), 1000, 2000)
        new.compare_and_append_table(rows(2000, 300, 3), 2000, 3000)
        cluster.network.nemesis.heal(cut)
        refused = old.answer()
        assert refused["outcome"] == WriterExpired.__name__, refused
        assert WriterExpired.__name__ in old.status()["heartbeat_errors"]
        new.compare_and_append_table(rows(3000, 400, 3), 3000, 4000)  # it goes on
        keys = sorted(shard.snapshot()["key"].to_pylist())
        assert keys == [0, 1, 2, 200, 201, 202, 300, 301, 302, 400, 401, 402]
        assert shard.state(refresh=True).upper == 4000
        new.close()
    old.kill()


def test_clocks_ten_minutes_off_leave_leases_and_retention_alone(emulated_cluster, monkeypatch):
    """Writers on h0 and h2 append and heartbeat while their hosts' clocks
    are moved ten minutes ahead and behind: for three leases no heartbeat
    or append is refused, retention keeps ``since`` its distance behind the
    upper, and once both writers are killed the server expires each about
    one lease after its last heartbeat (by its clock: a skewed one would
    expire the writer behind at once and the one ahead never)."""
    retain = 5000
    cluster = emulated_cluster(
        3,
        observer=True,
        clocks=True,
        consensus_args=["--writer-lease-ms", str(LEASE_MS), "--retain", str(retain)],
    )
    ahead, behind = HostWriter(cluster, 0, "ahead"), HostWriter(cluster, 2, "behind")
    cluster.network.nemesis.clock_skew("h0", 600)
    cluster.network.nemesis.clock_skew("h2", -600)
    assert abs(ahead.status()["wall"] - time.time() - 600) < 30
    assert abs(behind.status()["wall"] - time.time() + 600) < 30
    upper = 0
    writers = (ahead, behind)
    began = time.monotonic()
    while time.monotonic() - began < 3 * LEASE_MS / 1000:
        writer = writers[upper // 1000 % 2]
        assert writer.append(upper, upper + 1000, upper // 1000 * 10) == {"outcome": "ok"}
        upper += 1000
        time.sleep(0.3)  # appends spread over three leases: heartbeats must carry them
    for writer in writers:
        status = writer.status()
        assert status["heartbeats"] >= 4 and status["heartbeat_errors"] == [], status
    with _observer_shard(cluster, monkeypatch) as shard:
        looked: list = []

        def retained():
            looked[:] = [shard.state(refresh=True)]
            return looked[0] if looked[0].since == upper - retain else None

        state = wait_until(
            retained,
            10,
            lambda: f"since {upper - retain} (since, upper: {looked[0].since}, {looked[0].upper})",
        )
        assert state.upper == upper
        ahead.kill()
        behind.kill()
        killed = time.monotonic()
        gone: dict[str, float] = {}  # seconds from the kill to each one's expiry

        def all_gone() -> bool:
            present = shard.state(refresh=True).writers
            after = time.monotonic() - killed
            for writer in writers:
                if writer.writer_id not in present:
                    gone.setdefault(writer.writer_id, after)
            return len(gone) == len(writers)

        # a look at least every 50 ms: each expiry's time is measured
        wait_until(all_gone, 30, lambda: f"the expiry of both writers (gone: {gone})", every_s=0.05)
        for after in gone.values():  # its last heartbeat came at most 0.5 s before the kill
            assert LEASE_MS / 1000 - 1.0 <= after <= LEASE_MS / 1000 + 3.0, gone
        assert shard.snapshot().num_rows == upper // 1000 * 3
