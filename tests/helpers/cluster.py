"""Helpers of the cluster tests: a real builder process driven by the test,
and checks that a cluster left nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import psutil
import pyarrow as pa
import zmq

from shardsink import open_shard, protocol
from shardsink._curve import KEYS_ENV
from shardsink.cluster import Cluster, ClusterStats, IntervalRecord, Workload
from shardsink.config import ClusterConfig
from shardsink.persist.config import OFFLINE
from shardsink.process import Child, ConsensusProcess, Launch, SpawnStarter, kill_all
from shardsink.server.config import ServeConfig
from shardsink.shm import PartSender, list_segments
from shardsink.workloads import SCHEMA
from tests.helpers.wait import wait_until

TIMEOUT = 30.0
ROOT = Path(__file__).resolve().parents[2]
#: The writer the harness's parts are written as (a coordinator's mint names one).
WRITER = "cluster-test.1"


def rows_batch(keys: list[int], ts: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": k, "val": format(k, "032x"), "ts": ts, "diff": 1} for k in keys], schema=SCHEMA
    )


EMPTY = rows_batch([], 0)


class FakeWorker:
    """A test-driven worker of a :class:`BuilderHarness`: sends parts with
    contribution metadata and waits for the builder's answer. Every part goes
    through the arena (nothing inline), so :meth:`sync` proves the builder took
    every part sent so far."""

    def __init__(self, harness: BuilderHarness, index: int) -> None:
        self.index = index
        self.ctx = zmq.Context()
        self.handoff = self.ctx.socket(zmq.DEALER)
        self.handoff.setsockopt(zmq.IDENTITY, protocol.worker_identity(index))
        self.handoff.setsockopt(zmq.LINGER, 0)
        self.handoff.connect(harness.handoff)
        self.sender = PartSender(
            harness.parts,
            harness.cluster_id,
            message_part_max_bytes=-1,
            timeout=TIMEOUT,
            identity=protocol.worker_identity(index),
        )
        self.handoff.send(protocol.encode(protocol.HandoffHello(index)))
        assert self.handoff.poll(int(TIMEOUT * 1000)), "the builder did not welcome the worker"
        assert isinstance(protocol.decode_handoff(self.handoff.recv()), protocol.Welcome)

    def send(
        self,
        bid: tuple[int, int],
        batch: pa.RecordBatch,
        *,
        last: bool,
        barrier: bool = False,
        lower: int | None = None,
        upper: int | None = None,
    ) -> None:
        interval, attempt = bid
        meta = protocol.Contribute(
            interval=interval,
            attempt=attempt,
            lower=interval * 1000 if lower is None else lower,
            upper=(interval + 1) * 1000 if upper is None else upper,
            barrier=int(barrier),
            worker=self.index,
            rows=batch.num_rows,
            last=int(last),
            writer=WRITER,
        )
        self.sender.send(batch, protocol.contribute_meta(meta))

    def sync(self, timeout: float = TIMEOUT) -> None:
        self.sender.wait_acked(timeout)

    def answer(self) -> protocol.Handoff:
        assert self.handoff.poll(int(TIMEOUT * 1000)), "no answer from the builder"
        answer = protocol.decode_handoff(self.handoff.recv())
        assert isinstance(answer, protocol.Handoff)
        return answer

    def close(self) -> None:
        self.sender.close()
        self.handoff.close()
        self.ctx.term()


class BuilderHarness:
    """A real builder process whose coordinator and workers are the test."""

    def __init__(self, workers: int, **config) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shardsink-test-"))
        self.cluster_id = f"t{uuid.uuid4().hex[:10]}"
        self.blob_dir = self.dir / "blob"
        self.config = ClusterConfig(
            groups=1, workers=workers, blob=f"file://{self.blob_dir}", **config
        )
        self.parts = f"ipc://{self.dir / 'parts'}"
        self.handoff = f"ipc://{self.dir / 'handoff'}"
        self.ctx = zmq.Context()
        self.coord = self.ctx.socket(zmq.ROUTER)
        self.coord.setsockopt(zmq.LINGER, 0)
        coordinator = f"ipc://{self.dir / 'coord'}"
        self.coord.bind(coordinator)
        spec = protocol.ChildSpec(
            group=0,
            index=0,
            cluster_id=self.cluster_id,
            coordinator=coordinator,
            parts=self.parts,
            handoff=self.handoff,
            inline_max_bytes=4096,
            config=self.config,
        )
        launch = Launch("builder", "g0/b", protocol.BUILDER_ROLE, protocol.encode_spec(spec))
        self.builder: Child = Child(launch, SpawnStarter(), self.dir).start()
        self.workers: list[FakeWorker] = []
        try:
            assert self.coord.poll(int(TIMEOUT * 1000)), self.builder.log_tail()
            identity, raw = self.coord.recv_multipart()
            assert isinstance(protocol.decode_from_child(raw), protocol.Hello)
            # the test process creates every arena
            self.coord.send_multipart([identity, protocol.encode(protocol.Members((os.getpid(),)))])
            self.workers = [FakeWorker(self, w) for w in range(workers)]
        except BaseException:
            self.close()
            raise

    def tell(self, msg) -> None:
        self.coord.send_multipart([b"g0/b", protocol.encode(msg)])

    def blob_parts(self) -> list[Path]:
        return sorted(self.blob_dir.rglob("*.parquet")) if self.blob_dir.exists() else []

    def close(self) -> None:
        for w in self.workers:
            w.close()
        if self.builder.alive():
            self.tell(protocol.Shutdown())
            self.builder.wait(10)  # its exit, through a pidfd; still running after: killed
        kill_all([self.builder])
        self.coord.close()
        self.ctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> BuilderHarness:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout_s: float) -> float:
    """Seconds until none of ``pids`` runs; fails the test after ``timeout_s``."""
    began = time.monotonic()
    wait_until(
        lambda: not any(running(p) for p in pids),
        timeout_s,
        lambda: f"the end of processes {[p for p in pids if running(p)]}",
    )
    return time.monotonic() - began


def assert_nothing_left(pids: list[int], cluster_id: str) -> None:
    """No process of ``pids`` runs and no segment of the cluster exists."""
    alive = [pid for pid in pids if running(pid)]
    assert not alive, f"processes of the cluster still run: {alive}"
    assert list_segments(cluster_id) == [], list_segments(cluster_id)


class Run(NamedTuple):
    """What a finished cluster run left to check."""

    stats: ClusterStats
    records: list[IntervalRecord]
    pids: list[int]
    cluster_id: str


def child_pids(cluster: Cluster) -> list[int]:
    """The pids of the cluster's processes now, its coordinator (us) aside."""
    return [p.pid for p in cluster.processes() if p.kind != "coordinator"]


def run_cluster(data_dir: Path, intervals: int | None = None, **overrides) -> Run:
    """Run a small cluster to the end under ``data_dir``, then check that no
    process and no shared-memory segment of it is left."""
    settings = {"start_timeout_s": 60.0, "interval_timeout_s": 30.0, **overrides}
    config = ClusterConfig(data_dir=str(data_dir), **settings)
    with Cluster(config) as cluster:
        pids = child_pids(cluster)
        stats = cluster.run(intervals)
        records = cluster.records
        pids += child_pids(cluster)
    assert_nothing_left(pids, cluster.cluster_id)
    return Run(stats, records, pids, cluster.cluster_id)


def sweep_leaked(data_dir: Path, rows: int) -> list[str]:
    """Sweep the leaked blobs of the shard a run left under ``data_dir``, its
    processes all gone (its writers expired first), check it still holds
    ``rows`` rows, and return what was swept."""
    config = ClusterConfig(data_dir=str(data_dir))
    with open_shard(
        "default",
        blob=config.blob_uri,
        consensus=config.consensus_uri,
        schema=SCHEMA,
        config=OFFLINE,
    ) as shard:
        time.sleep(0.002)  # past the lease of the last writer seen
        shard.collect_garbage()
        leaked = shard.sweep_leaked_blobs()
        assert shard.snapshot().num_rows == rows  # the sweep took nothing appended
    return leaked


def workers_with_rows(workload: Workload, interval: int, n_workers: int) -> int:
    """How many of ``n_workers`` global workers have rows in ``interval``."""
    return sum(workload.updates(interval, w, n_workers).num_rows > 0 for w in range(n_workers))


def two_ups(tmp_path: Path, popen, flags: list[str], timeout_s: float) -> tuple[list[dict], list]:
    """Two ``shardsink up --json FLAGS`` at once through ``popen``, each with
    a data dir of its own under ``tmp_path``, run to their end: what each
    printed, and when each ended (monotonic). Fails the test if either is
    still running after ``timeout_s`` (naming its last words) or exits
    other than 0."""
    outputs = [(tmp_path / f"out{i}", tmp_path / f"err{i}") for i in range(2)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = []
    for i, (out, err) in enumerate(outputs):
        argv = [sys.executable, "-m", "shardsink.cli", "up", "--json", *flags,
                "--data-dir", str(tmp_path / f"d{i}")]  # fmt: skip
        with out.open("w") as stdout, err.open("w") as stderr:
            procs.append(popen(argv, cwd=ROOT, env=env, stdout=stdout, stderr=stderr))
    ended: dict[int, float] = {}

    def both_ended() -> bool:
        for i, proc in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.monotonic()
        return len(ended) == 2

    def running_logs() -> str:
        logs = [outputs[i][1].read_text()[-3000:] for i in range(2) if i not in ended]
        return f"the end of both runs (still running: {logs})"

    wait_until(both_ended, timeout_s, running_logs, every_s=0.05)  # when each ended, to 50 ms
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.read_text()
    return [json.loads(out.read_text()) for out, _ in outputs], [ended[0], ended[1]]


@contextlib.contextmanager
def replica_server(tmp_path: Path, monkeypatch):
    """A consensus server on ``tcp://`` loopback over SQLite and file stores
    under ``tmp_path``, whose CURVE keys every client of the test finds
    (``SHARDSINK_KEYS``): for clusters writing the same shards. Yields it
    and the blob URI."""
    blob = f"file://{tmp_path / 'blob'}"
    store = f"sqlite://{tmp_path / 'consensus.db'}"
    monkeypatch.setenv(KEYS_ENV, str(tmp_path / "keys"))
    with ConsensusProcess(store, blob, ServeConfig(bind="tcp://127.0.0.1:0")) as server:
        yield server, blob
