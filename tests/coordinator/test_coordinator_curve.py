"""The coordinator over TCP (``coordinator_bind``): a CURVE server whose keys
the coordinator makes for the cluster in memory; its builders and workers
connect with the client keys of their launch payload, anyone else is
refused, and the secret shows in no argv, environment, log or file."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
import zmq

from shardsink import protocol
from shardsink._curve import ClientKeys, CurveServer, ephemeral_keys, secure_client
from shardsink.cli.cluster import FLAGS
from shardsink.cluster import Cluster
from shardsink.config import ClusterConfig
from tests.helpers.cluster import assert_nothing_left, child_pids

#: How long an intruder waits for an answer it must not get.
REFUSED_MS = 1500
INTERVALS = 3


def _dealer(ctx: zmq.Context, address: str, keys: ClientKeys | None, identity: bytes):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, identity)
    if keys is not None:
        secure_client(sock, keys)
    sock.connect(address)
    return sock


def _intruders(ctx: zmq.Context, address: str, server_public: bytes):
    """A DEALER without keys and one with a client key pair of its own (the
    right server key), both claiming worker g0/w0's routing id."""
    public, secret = zmq.curve_keypair()
    return {
        "plain": _dealer(ctx, address, None, b"g0/w0"),
        "wrong key": _dealer(ctx, address, ClientKeys(server_public, public, secret), b"g0/w0"),
    }


def test_an_in_memory_curve_server_answers_only_its_one_client():
    server_keys, client = ephemeral_keys()
    assert server_keys.clients == frozenset({client.public})
    assert server_keys.public == client.server
    for keys, secret in ((server_keys, server_keys.secret), (client, client.secret)):
        assert secret.decode() not in repr(keys) and "secret=***" in repr(keys)
    ctx = zmq.Context()
    curve = CurveServer(ctx, server_keys)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    socks = []
    try:
        curve.secure(router)
        router.bind("tcp://127.0.0.1:0")
        address = router.getsockopt_string(zmq.LAST_ENDPOINT)
        intruders = _intruders(ctx, address, client.server)
        socks = list(intruders.values())
        for sock in socks:
            sock.send(b"intruder")
        friend = _dealer(ctx, address, client, b"friend")
        socks.append(friend)
        friend.send(b"hello")
        assert router.poll(5000)
        identity, body = router.recv_multipart()
        assert (identity, body) == (b"friend", b"hello")
        router.send_multipart([b"friend", b"welcome"])
        assert friend.poll(5000) and friend.recv() == b"welcome"
        assert not router.poll(REFUSED_MS), "an intruder's message got through"
        assert curve.denied >= 1  # the wrong key reached ZAP and was refused
    finally:
        for sock in socks:
            sock.close()
        router.close()
        curve.close()
        ctx.term()


def test_coordinator_bind_is_tcp_or_empty():
    """Empty, or tcp://: CURVE-only, so any address it is configured with
    (another machine's hosts reach it)."""
    assert ClusterConfig().coordinator_bind == ""
    for good in ("tcp://127.0.0.1:0", "tcp://10.0.0.1:5000"):
        assert ClusterConfig(coordinator_bind=good).coordinator_bind == good
    for bad in ("ipc:///tmp/coord", "tcp://127.0.0.1", "coord"):
        with pytest.raises(ValueError, match="coordinator_bind"):
            ClusterConfig(coordinator_bind=bad)
    assert "coordinator_bind" in FLAGS


def test_a_child_spec_hides_its_keys_from_repr_and_round_trips():
    _, client = ephemeral_keys()
    spec = protocol.ChildSpec(
        0, 0, "c1", "tcp://127.0.0.1:1", "ipc:///b", "ipc:///c", 4096, ClusterConfig(),
        coordinator_keys=protocol.CurveKeys.of(client),
    )  # fmt: skip
    assert client.secret.decode() not in repr(spec)
    assert protocol.decode_spec(protocol.encode_spec(spec)) == spec
    assert spec.coordinator_keys is not None
    assert spec.coordinator_keys.client_keys() == client


def _secret_in(path: Path, secret: bytes) -> bool:
    try:
        return secret in path.read_bytes()
    except (FileNotFoundError, PermissionError, IsADirectoryError, ProcessLookupError):
        return False


@pytest.mark.parametrize("mode", ["barrier", "best-effort"])
def test_a_cluster_runs_over_curve_and_refuses_other_clients(tmp_path, mode):
    config = ClusterConfig(
        data_dir=str(tmp_path),
        coordinator_bind="tcp://127.0.0.1:0",
        groups=2,
        workers=2,
        mode=mode,
        rows_per_interval=200,
        shared_max_bytes=64 << 10,
        start_timeout_s=30.0,
        interval_timeout_s=30.0,
    )
    ctx = zmq.Context()
    intruders: dict[str, zmq.Socket] = {}
    with Cluster(config) as cluster:
        coordinator = cluster.coordinator
        assert coordinator is not None and coordinator.child_keys is not None
        assert coordinator.address.startswith("tcp://127.0.0.1:")
        assert not coordinator.address.endswith(":0")
        secret = coordinator.child_keys.secret.encode()
        pids = child_pids(cluster)
        try:
            intruders = _intruders(ctx, coordinator.address, coordinator.child_keys.server.encode())
            hello = protocol.encode(protocol.Hello("worker", 0, 0, os.getpid()))
            for sock in intruders.values():
                sock.send(hello)
            stats = cluster.run(INTERVALS)
            for name, sock in intruders.items():
                assert not sock.poll(REFUSED_MS), f"the coordinator answered the {name} client"
            assert coordinator._curve is not None and coordinator._curve.denied >= 1
            # (c) the secret is in no child's argv or environment, no log, no file
            live = [p.pid for p in psutil.Process().children(recursive=True)]
            assert len(live) > config.groups * (config.workers + 1), "too few children to look at"
            for pid in live:
                for what in ("cmdline", "environ"):
                    assert not _secret_in(Path(f"/proc/{pid}/{what}"), secret), (pid, what)
            assert cluster.run_dir is not None
            for root in (cluster.run_dir, tmp_path):
                files = [p for p in root.rglob("*") if p.is_file()]
                assert files
                leaked = [str(p) for p in files if _secret_in(p, secret)]
                assert not leaked, f"the CURVE secret is in {leaked}"
            assert cluster.logs is not None and any(cluster.logs.glob("*.log"))
        finally:
            for sock in intruders.values():
                sock.close()
            ctx.term()
        pids += child_pids(cluster)
    assert stats.verified is True, stats.verify_detail
    assert stats.appends == INTERVALS and stats.restarts == 0 and stats.abandoned_attempts == 0
    assert_nothing_left(pids, cluster.cluster_id)
