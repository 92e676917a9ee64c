"""An :class:`EmulatedCluster` as a chaos run owns one: what runs where and
its pids, the consensus server killed and started again at its address,
reached from the coordinator's host, a host's clock skewed; a service that
does not start closes everything. Each starts its own three Ray nodes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from shardsink import datadir
from shardsink.netns.names import netns_names
from shardsink.testing.emulated import EmulatedCluster, EmulationError
from shardsink.testing.netns import require

pytestmark = pytest.mark.slow


def _stats_pid(cluster: EmulatedCluster, timeout_s: float = 5.0) -> int | None:
    """The pid the consensus server answers ``consensus stats`` with, asked
    from the coordinator's host with its keys; ``None`` if it does not answer."""
    argv = [sys.executable, "-m", "shardsink.cli", "consensus", "stats", "--json"]
    argv += ["--timeout", str(timeout_s), cluster.consensus_address]
    proc = cluster.popen_on(
        cluster.place.coordinator,
        argv,
        env=cluster.coordinator_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    out, _ = proc.communicate(timeout=timeout_s + 60)
    cluster.stop(proc)
    return msgspec.json.decode(out)["pid"] if proc.returncode == 0 else None


def test_the_consensus_server_restarts_where_it_was(emulated_cluster):
    cluster = emulated_cluster(3, clocks=True)
    hosts = cluster.hosts()
    assert [h.roles for h in hosts] == [
        ("coordinator", "ray head", "ray node"),
        ("ray node", "consensus"),
        ("ray node",),
    ]
    assert all(h.pids for h in hosts) and cluster.consensus_pid in hosts[1].pids
    assert cluster.consensus_address == f"tcp://{hosts[1].address}:7000"
    first = cluster.consensus_pid
    assert _stats_pid(cluster) == first  # from h0, across the emulated network

    cluster.kill_consensus()
    assert cluster.consensus_pid is None and first not in cluster.hosts()[1].pids
    assert _stats_pid(cluster, timeout_s=2.0) is None
    cluster.start_consensus()
    second = cluster.consensus_pid
    assert second not in (None, first) and second in cluster.hosts()[1].pids
    assert _stats_pid(cluster) == second  # at the same address, with the same keys
    with pytest.raises(ValueError, match="runs already"):
        cluster.start_consensus()

    cluster.network.nemesis.clock_skew("h2", 3600)
    date = cluster.popen_on(2, ["date", "+%s"], stdout=subprocess.PIPE, text=True)
    out, _ = date.communicate(timeout=30)
    cluster.stop(date)
    assert abs(int(out) - time.time() - 3600) < 60
    inside = ["ip", "netns", "exec", hosts[2].netns, "date", "+%s"]  # started by other means
    skewed = subprocess.run(inside, env=cluster.environ(2), capture_output=True, timeout=30)
    plain = subprocess.run(inside, capture_output=True, timeout=30)  # without the host's clock
    assert abs(int(skewed.stdout) - time.time() - 3600) < 60
    assert abs(int(plain.stdout) - time.time()) < 60


def test_a_service_that_does_not_start_closes_everything(tmp_path):
    require([EmulatedCluster.check])
    data = datadir.create(tmp_path / "d")
    before = set(netns_names())
    refused = pytest.raises(EmulationError, match=r"(?s)consensus on h1 exited 2: .*data dir")
    with datadir.acquire(data, datadir.COORDINATOR), refused:  # the server cannot hold it
        EmulatedCluster(3, data_dir=data, run="test", timeout_s=60)
    assert set(netns_names()) <= before  # no namespace of its own left


def test_postgresql_on_its_host_and_its_data_go_with_it(emulated_cluster):
    """With 2 hosts PostgreSQL (and S3) wrap to h0, across the network from
    the consensus server on h1, which keeps its state there; closing stops
    it and removes its data directory (a second SIGTERM, while the S3
    server was stopped beside it, cut that short)."""
    cluster = emulated_cluster(2, postgres=True, s3=True)
    assert cluster.hosts()[0].roles == ("coordinator", "ray head", "ray node", "postgres", "s3")
    assert cluster.store.startswith("postgresql://u") and f"@{cluster.address(0)}:" in cluster.store
    assert _stats_pid(cluster) == cluster.consensus_pid  # it serves from PostgreSQL
    data = next(
        Path(arg)
        for pid in cluster.hosts()[0].pids
        if (argv := _cmdline(pid)) and argv[0].endswith("/postgres")
        for arg in argv[argv.index("-D") + 1 : argv.index("-D") + 2]
    )
    assert data.is_dir()
    cluster.close()
    assert not data.parent.exists()


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []
