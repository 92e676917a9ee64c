"""The server's GC runs on its own schedule, off the request loop."""

from __future__ import annotations

import threading

from shardsink import open_shard
from shardsink.persist.config import ShardConfig
from shardsink.server import ServerClient
from shardsink.storage import open_blob
from shardsink.workloads import Workload
from tests.helpers.server import serving
from tests.helpers.wait import wait_until

WORKLOAD = Workload("trickle", rows_per_interval=16, interval_ms=1)


class GatedBlob:
    """A blob store whose deletes wait until ``release`` is set: a very slow store."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.entered = threading.Event()
        self.release = threading.Event()

    def delete(self, key: str) -> None:
        self.entered.set()
        assert self.release.wait(60), "test never released the gate"
        self.inner.delete(key)

    def get(self, key):
        return self.inner.get(key)

    def set(self, key, data):
        self.inner.set(key, data)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def list_meta(self, prefix=""):
        return self.inner.list_meta(prefix)

    def stat(self, key):
        return self.inner.stat(key)

    def open_input(self, key):
        return self.inner.open_input(key)

    def close(self) -> None:
        self.inner.close()


def test_gc_deletes_do_not_stall_appends(tmp_path) -> None:
    blob_uri = f"file://{tmp_path}/blob"
    gated = GatedBlob(open_blob(blob_uri))
    config = ShardConfig(inline_max_bytes=0)  # every part in blob, so compaction retires blobs
    with serving(tmp_path, gated, gc_interval_s=0.05) as server:
        try:
            with open_shard(
                "g", blob=blob_uri, consensus=server.address, config=config, create=True
            ) as shard:
                writer = shard.writer()
                for i in range(4):
                    writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
                parts_before = set(gated.inner.list("g/part/"))
                assert len(parts_before) == 4
                assert shard.compact().applied == 1
                assert gated.entered.wait(30), "the server never started deleting retired blobs"
                # the maintenance thread is stuck in a delete; the request loop is not
                assert writer.compare_and_append_table(WORKLOAD.updates(4), 4, 5) == 5
                assert shard.reader().snapshot().equals(WORKLOAD.expected(5))
                gated.release.set()
                wait_until(
                    lambda: not parts_before & set(gated.inner.list("g/part/")),
                    30,
                    "the deletion of the retired blobs",
                )
                client = ServerClient(server.address)
                try:
                    (counters,) = client.stats().shards
                finally:
                    client.close()
                assert counters.gc_runs >= 1 and counters.blobs_deleted >= 4
                assert shard.reader().snapshot().equals(WORKLOAD.expected(5))
        finally:
            gated.release.set()
    server.close()  # idempotent


class ReadGatedBlob(GatedBlob):
    """A blob store whose reads of ``gated`` keys wait until ``release`` is
    set, in the first thread that reads one only: a pass that started with
    only some of the gated batches leaves the others to another lane, which
    must not wait too (it did, on a loaded machine)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.gated: set[str] = set()
        self._holder: int | None = None
        self._lock = threading.Lock()

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def _wait(self, key: str) -> None:
        if key not in self.gated:
            return
        with self._lock:
            if self._holder is None:
                self._holder = threading.get_ident()
        if self._holder == threading.get_ident():
            self.entered.set()
            assert self.release.wait(60), "test never released the gate"

    def get(self, key):
        self._wait(key)
        return self.inner.get(key)

    def open_input(self, key):
        self._wait(key)
        return self.inner.open_input(key)


def test_merge_lanes_run_at_once_and_lose_nothing(tmp_path, monkeypatch) -> None:
    """A pass stuck on its inputs in one lane (a slow read) does not hold up
    the merges of the batches appended meanwhile: another lane merges them
    while it waits, and once it goes on both commit, every row exactly once."""
    from shardsink.server import maintenance as server_module

    # lanes of 2 KB, 64 MiB and no cap: a run of a few small parts fills the first
    monkeypatch.setattr(server_module, "LANE_CAPS", (2_000, 64 << 20, None))
    blob_uri = f"file://{tmp_path}/blob"
    gated = ReadGatedBlob(open_blob(blob_uri))
    config = ShardConfig(inline_max_bytes=0)
    with serving(tmp_path, gated, compact_interval_s=0.02, compact_slack=2) as server:
        try:
            with open_shard(
                "g", blob=blob_uri, consensus=server.address, config=config, create=True
            ) as shard:
                writer = shard.writer()
                first = [writer.batch(WORKLOAD.updates(i), i, i + 1) for i in range(4)]
                gated.gated = {k for batch in first for k in batch.blob_keys()}
                for i, batch in enumerate(first):
                    writer.compare_and_append([batch], i, i + 1)
                assert gated.entered.wait(30), "no pass read the first batches"
                merged = _counters(server).compactions
                _append(writer, 4, 12)
                wait_until(  # while the first pass waits
                    lambda: _counters(server).compactions != merged,
                    30,
                    "a merge by another lane meanwhile",
                    every_s=0.02,
                )
                assert not gated.release.is_set()
                gated.release.set()
                ids = {batch.id for batch in first}
                wait_until(
                    lambda: not ids & shard.state(refresh=True).batches.keys(),
                    30,
                    "the waiting pass's commit",
                    every_s=0.02,
                )
                assert shard.reader().snapshot().equals(WORKLOAD.expected(12))
                assert shard.verify().ok
                assert _counters(server).compactions_abandoned == 0
        finally:
            gated.release.set()


def _append(writer, first: int, end: int) -> None:
    for i in range(first, end):
        writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)


def _counters(server):
    (counters,) = server.stats().shards
    return counters


def test_a_failing_compaction_is_counted_in_stats_and_metrics(tmp_path) -> None:
    """A merge that raises (the fault point after its output is written,
    armed to fail twice) is counted by kind, shown by ``consensus stats``
    and ``/metrics``, and retried: the shard ends merged and exact."""
    import urllib.request

    from shardsink import faults
    from shardsink.server.metrics import ServerMetrics

    blob_uri = f"file://{tmp_path}/blob"
    faults.arm(["compaction.after_write:determinate:1.0:2"])
    try:
        with serving(
            tmp_path, open_blob(blob_uri), compact_interval_s=0.02, compact_slack=2
        ) as server:
            metrics = ServerMetrics(server, 0)
            try:
                with open_shard("f", blob=blob_uri, consensus=server.address, create=True) as shard:
                    _append(shard.writer(), 0, 12)
                    wait_until(
                        lambda: _counters(server).compactions, 30, "a merge committed", every_s=0.02
                    )
                    counters = _counters(server)
                    assert counters.failures["compaction"] == 2
                    assert "DeterminateError" in counters.last_failure
                    assert shard.reader().snapshot().equals(WORKLOAD.expected(12))
                with urllib.request.urlopen(metrics.url, timeout=10) as response:
                    text = response.read().decode()
                line = 'shardsink_maintenance_failures_total{kind="compaction",shard="f"} 2.0'
                assert line in text
            finally:
                metrics.close()
    finally:
        faults.arm([])
