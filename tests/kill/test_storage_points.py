"""Deterministic kill tests at the fault points of the storage side: GC, the
consensus server and readers. Each arms one point, lets it fire, and checks
the shard is exact and every part it references exists."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from shardsink import faults, open_shard
from shardsink.persist import ShardConfig
from shardsink.persist.state import BlobPart
from shardsink.process import ConsensusProcess
from shardsink.server.config import ServeConfig
from shardsink.storage import open_blob
from shardsink.workloads import Workload
from tests.helpers.wait import wait_until

WORKLOAD = Workload("churn", rows_per_interval=16, interval_ms=10)
BLOB_PARTS = ShardConfig(inline_max_bytes=0)  # every part in blob, so GC has work


def _stores(tmp_path) -> tuple[str, str]:
    return f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/consensus.db"


def _append(shard, start: int, stop: int) -> None:
    writer = shard.writer()
    t = WORKLOAD.interval_ms
    for i in range(start, stop):
        writer.compare_and_append_table(WORKLOAD.updates(i), i * t, (i + 1) * t)


def _check_exact(shard, intervals: int) -> None:
    """The shard holds exactly the workload's collection, and every part exists."""
    state = shard.state(refresh=True)
    assert state.upper == intervals * WORKLOAD.interval_ms
    assert shard.reader().snapshot().equals(WORKLOAD.expected(intervals))
    blob = open_blob(shard.blob.uri)
    try:
        for batch in state.batches.values():
            for part in batch.parts:
                if isinstance(part, BlobPart):
                    assert blob.get(part.key) is not None, f"missing part {part.key}"
    finally:
        blob.close()


def test_gc_killed_between_listing_and_delete(tmp_path) -> None:
    blob, consensus = _stores(tmp_path)
    with open_shard("k", blob=blob, consensus=consensus, config=BLOB_PARTS, create=True) as shard:
        _append(shard, 0, 6)
        assert shard.compact().applied >= 1
        retired = {k for keys in shard.state(refresh=True).retired.values() for k in keys}
        assert retired
    gc = [sys.executable, "-m", "shardsink.cli", "shard", "gc"]
    gc += ["--blob", blob, "--consensus", consensus, "--shard", "k"]
    env = {**os.environ, **faults.environ(["gc.before_delete:kill"], fault_dir=tmp_path / "f")}
    killed = subprocess.run(gc, env=env, capture_output=True, timeout=120)
    assert killed.returncode == -9
    assert [r["point"] for r in faults.fired(tmp_path / "f")] == ["gc.before_delete"]
    with open_shard("k", blob=blob, consensus=consensus, create=True) as shard:
        _check_exact(shard, 6)
        assert retired <= set(shard.blob.list("k/"))  # nothing deleted yet
    again = subprocess.run(gc, env=env, capture_output=True, timeout=120)  # budget spent
    assert again.returncode == 0, again.stderr
    with open_shard("k", blob=blob, consensus=consensus, create=True) as shard:
        _check_exact(shard, 6)
        assert not retired & set(shard.blob.list("k/"))


def test_consensus_killed_after_store_before_reply(tmp_path) -> None:
    blob, store = _stores(tmp_path)
    fault_env = faults.environ(
        ["consensus.after_store:kill:0.2:3"], seed=3, fault_dir=tmp_path / "f"
    )
    bind = f"ipc://{tmp_path}/sock/c"
    server = ConsensusProcess(store, blob, ServeConfig(bind=bind), env=fault_env)
    stop = threading.Event()

    def restarter() -> None:
        while not stop.wait(0.02):  # a look every 20 ms, until told to stop
            if not server.alive():
                server.start()

    config = ShardConfig(server_timeout_s=0.5, server_retry_for_s=60)
    with server:
        watcher = threading.Thread(target=restarter)
        watcher.start()
        try:
            with open_shard(
                "k", blob=blob, consensus=server.address, config=config, create=True
            ) as shard:
                _append(shard, 0, 30)
                _check_exact(shard, 30)
        finally:
            stop.set()
            watcher.join(30)
    assert len(faults.fired(tmp_path / "f")) == 3
    assert server.starts == 4
    with open_shard("k", blob=blob, consensus=store, create=True) as shard:
        _check_exact(shard, 30)


def test_reader_paused_before_fetch_while_compaction_and_gc_run(tmp_path, monkeypatch) -> None:
    blob, consensus = _stores(tmp_path)
    monkeypatch.setenv(faults.ENV_PAUSE, "4")  # outlasts compaction and GC on a busy machine
    with open_shard("k", blob=blob, consensus=consensus, config=BLOB_PARTS, create=True) as shard:
        _append(shard, 0, 6)
        reader = shard.reader()
        faults.arm(["reader.before_fetch:pause"], fault_dir=tmp_path / "f", role="reader")
        got = {}
        thread = threading.Thread(target=lambda: got.setdefault("t", reader.snapshot()))
        try:
            thread.start()
            wait_until(  # at least every 10 ms: the pause it holds is 4 s
                lambda: faults.fired(tmp_path / "f"),
                30,
                "the reader at its fault point",
                every_s=0.01,
            )
            # the reader has selected its batches; compaction retires them and GC runs
            assert shard.compact().applied >= 1
            shard.collect_garbage()
            assert thread.is_alive(), "the reader's pause ended before GC: the race was not run"
            thread.join(30)
            assert not thread.is_alive(), "the reader is stuck"
        finally:
            faults.disarm()
        assert got["t"].equals(WORKLOAD.expected(6))
        reader.close()
        shard.collect_garbage()  # with the lease released, the retired blobs go
        _check_exact(shard, 6)
        assert not shard.state(refresh=True).retired


def test_readers_never_fail_while_gc_and_compaction_run_under_faults(tmp_path) -> None:
    """Readers snapshot at random as-ofs (and pause between selecting and
    fetching) while a writer appends and ``shard compact`` / ``shard gc``
    children run with failing blob calls and get killed between GC's listing
    and its deletes (the first three times). No snapshot fails with a missing part or is wrong."""
    import random

    from shardsink.persist import NotReadable

    blob, consensus = _stores(tmp_path)
    t = WORKLOAD.interval_ms
    fault_env = faults.environ(
        ["gc.before_delete:kill:1:3", "blob.call:indeterminate:0.3:0"],
        seed=11,
        fault_dir=tmp_path / "f",
    )
    env = {**os.environ, **fault_env}
    stores = ["--blob", blob, "--consensus", consensus, "--shard", "k"]
    stop = threading.Event()
    checked, failures = [], []

    def read(index: int) -> None:
        rng = random.Random(index)
        with open_shard(
            "k", blob=blob, consensus=consensus, config=BLOB_PARTS, create=True
        ) as shard:
            reader = shard.reader()
            while not stop.is_set():
                state = reader.lease()
                as_of = rng.randrange(max(state.since, 0), state.upper)
                try:
                    table = reader.snapshot(as_of)
                except NotReadable:  # since moved past the as-of meanwhile
                    continue
                except Exception as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                if not table.equals(WORKLOAD.expected(as_of // t + 1, as_of)):
                    failures.append(f"wrong snapshot as of {as_of}")
                checked.append(as_of)

    with open_shard("k", blob=blob, consensus=consensus, config=BLOB_PARTS, create=True) as shard:
        _append(shard, 0, 4)
        faults.arm(
            ["reader.before_fetch:pause:0.3:0"], seed=2, fault_dir=tmp_path / "r", pause_s=0.05
        )
        readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for thread in readers:
            thread.start()
        codes = []
        try:
            for round_ in range(8):
                _append(shard, 4 + 4 * round_, 8 + 4 * round_)
                shard.advance_since(shard.upper - 6 * t)
                grace = str(ShardConfig().writer_lease_ms)  # the shortest the sweep allows
                for command in (["compact"], ["gc", "--sweep-grace-ms", grace]):
                    argv = [sys.executable, "-m", "shardsink.cli", "shard", *command, *stores]
                    codes.append(subprocess.run(argv, env=env, timeout=120).returncode)
        finally:
            stop.set()
            for thread in readers:
                thread.join(60)
            faults.disarm()
        assert failures == []
        assert len(checked) > 20
        assert codes.count(-9) == 3  # GC killed between listing and delete
        assert faults.fired(tmp_path / "r")  # readers paused before fetching
        assert any(f["point"] == "blob.call" for f in faults.fired(tmp_path / "f"))
        shard.collect_garbage()
        _check_exact(shard, 36)
