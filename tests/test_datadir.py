"""The data dir's lock: one writer of state. A cluster or a consensus server
on a data dir holds it and names its server's address; ``shard`` commands on
the data dir go through that server, or hold the lock themselves; a second
``up`` is refused naming the holder; a stale lock is reported and replaced."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest

from shardsink import datadir, open_shard
from shardsink._curve import client_keys
from shardsink.cli import main
from shardsink.cluster import Cluster, ClusterConfig
from shardsink.persist import Shard
from shardsink.server import ServerClient

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _live_holder(data_dir: Path) -> datadir.Holder | None:
    """The holder the lock file names, if its process still runs (``None``:
    free, stale or not yet written); read without taking the lock."""
    holder = datadir.recorded_holder(data_dir)
    return holder if holder is not None and holder.alive() else None


def test_the_record_reads_with_fields_it_does_not_know(tmp_path):
    """A later version may add fields to the record (a metrics URL): this one still reads it."""
    record = {"pid": 1, "start": 2, "kind": "coordinator", "control": "ipc://x", "metrics": "h"}
    (tmp_path / datadir.LOCK_NAME).write_text(json.dumps(record))
    holder = msgspec.json.decode((tmp_path / datadir.LOCK_NAME).read_bytes(), type=datadir.Holder)
    assert holder == datadir.Holder(pid=1, start=2, kind="coordinator", control="ipc://x")


def test_a_second_taker_is_refused_naming_the_holder(tmp_path):
    with datadir.acquire(tmp_path, datadir.COORDINATOR) as lock:
        assert _mode(tmp_path / datadir.LOCK_NAME) == 0o600
        lock.update(address="tcp://127.0.0.1:7")
        holder = _live_holder(tmp_path)
        assert holder is not None and holder.alive()
        assert (holder.pid, holder.kind) == (os.getpid(), "coordinator")
        with pytest.raises(datadir.DataDirBusy) as busy:
            datadir.acquire(tmp_path, datadir.CONSENSUS_SERVER)
        assert str(busy.value) == (
            f"data dir {tmp_path} is in use by coordinator pid {os.getpid()} (consensus server "
            "at tcp://127.0.0.1:7); go through its consensus server: --consensus tcp://127.0.0.1:7"
        )
        assert datadir.acquire_or_server(tmp_path) == lock.holder
    assert _live_holder(tmp_path) is None
    assert (tmp_path / datadir.LOCK_NAME).read_bytes() == b""  # let go cleanly: nothing stale
    datadir.acquire(tmp_path, datadir.SHARD_COMMAND).close()


def test_a_shard_command_waits_for_the_server_address_then_gives_up(tmp_path):
    with datadir.acquire(tmp_path, datadir.COORDINATOR) as lock:
        with pytest.raises(datadir.DataDirBusy, match=r"in use by coordinator pid \d+ \(waited"):
            datadir.acquire_or_server(tmp_path, wait_s=0.2)
        timer = threading.Timer(0.3, lock.update, kwargs={"address": "ipc:///x/c"})
        timer.start()
        try:
            assert datadir.acquire_or_server(tmp_path, wait_s=30).address == "ipc:///x/c"
        finally:
            timer.cancel()
            timer.join()


def test_a_stale_lock_is_reported_and_replaced(tmp_path, popen, caplog):
    holder = popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from shardsink import datadir; "
            f"datadir.acquire({str(tmp_path)!r}, datadir.COORDINATOR); "
            "print('held', flush=True); time.sleep(120)",  # holds the lock until killed
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(datadir.DataDirBusy, match=f"coordinator pid {holder.pid}"):
        datadir.acquire(tmp_path, datadir.COORDINATOR)
    holder.kill()
    holder.wait(10)
    assert _live_holder(tmp_path) is None  # the record names a dead process
    with caplog.at_level(logging.WARNING), datadir.acquire(tmp_path, datadir.COORDINATOR):
        assert _live_holder(tmp_path).pid == os.getpid()
    assert f"replacing the stale lock of coordinator pid {holder.pid}, gone" in caplog.text


def test_a_shard_command_without_a_server_holds_the_lock(tmp_path, capsys, monkeypatch):
    with open_shard(
        blob=datadir.blob_uri(tmp_path), consensus=datadir.consensus_uri(tmp_path), create=True
    ):
        pass
    during = []
    compact = Shard.compact

    def watched(shard):
        during.append(_live_holder(tmp_path))
        return compact(shard)

    monkeypatch.setattr(Shard, "compact", watched)
    assert main(["shard", "compact", "--data-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    assert [(h.pid, h.kind) for h in during] == [(os.getpid(), "shard-command")]
    assert _live_holder(tmp_path) is None


def test_shard_commands_go_through_the_cluster_consensus_server(tmp_path, capsys):
    """compact and gc by hand on a running cluster's data dir: the cluster's
    consensus server applies them, so its state (not a stale cache) is what
    readers and the next appends see. Written straight to the store, its
    readers would still list the compacted batches, whose blobs gc deleted."""
    data = tmp_path / "d"
    config = ClusterConfig(data_dir=str(data), groups=1, workers=2, intervals=4)
    with Cluster(config) as cluster:
        assert _mode(data) == 0o700
        assert cluster.run().verified is True
        holder = _live_holder(data)
        assert (holder.pid, holder.kind) == (os.getpid(), "coordinator")
        assert holder.address == cluster.consensus.address
        assert main(["shard", "compact", "--data-dir", str(data)]) == 0
        assert json.loads(capsys.readouterr().out)["applied"] == 1
        assert main(["shard", "gc", "--data-dir", str(data), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["blobs_deleted"]
        assert len(cluster.shard.state(refresh=True).batches) == 1
        assert cluster.verify().ok
        assert cluster.run(2).verified is True


def test_up_on_a_data_dir_a_consensus_server_serves(tmp_path, popen, capsys):
    """``consensus serve --data-dir`` holds the lock and names its address: a
    plain ``up`` is refused naming it, ``up --consensus ADDR`` runs through
    it (with the CURVE keys it made in the data dir), and ``shard`` commands
    on the data dir are served by it."""
    data = tmp_path / "d"
    server = popen(
        [
            *(sys.executable, "-m", "shardsink.cli", "consensus", "serve"),
            *("--data-dir", str(data), "--bind", "tcp://127.0.0.1:0"),
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = server.stdout.readline()
    assert line.startswith("listening on "), line
    address = line.removeprefix("listening on ").strip()
    assert _mode(data) == 0o700
    holder = _live_holder(data)
    assert (holder.pid, holder.kind, holder.address) == (server.pid, "consensus-server", address)

    assert main(["up", "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"in use by consensus server pid {server.pid}" in err
    assert f"--consensus {address}" in err
    config = ClusterConfig(data_dir=str(data), consensus=address, groups=1, workers=1, intervals=2)
    with Cluster(config) as cluster:
        assert cluster.run().verified is True

    client = ServerClient(address, retry_for_s=0, keys=client_keys(data / "keys", address))
    try:
        before = client.stats().requests
        assert main(["shard", "inspect", "--data-dir", str(data), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["upper"] == 2000
        assert client.stats().requests > before + 1
    finally:
        client.close()
    server.terminate()
    assert server.wait(30) == 0
    assert _live_holder(data) is None
    assert main(["shard", "inspect", "--data-dir", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["upper"] == 2000
