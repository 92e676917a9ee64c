"""Issue "Nothing lost", finding 2: what a consensus server takes from its
clients. Each test fails on the code before the fix: the server committed
any part key a client sent and answered anyone on a ``tcp://`` bind
(maintenance commands refused from clients: ``test_server.py``)."""

from __future__ import annotations

import contextlib
import threading
import uuid

import pytest
import zmq

from shardsink import open_shard
from shardsink._curve import ClientKeys, client_keys, server_keys
from shardsink.persist import ShardConfig
from shardsink.persist.commands import ExpireReaders
from shardsink.persist.state import Batch
from shardsink.server import ConsensusServer, ServerClient
from shardsink.server.wire import Ping, RunCommand, encode
from shardsink.storage import open_blob, open_consensus
from shardsink.storage.errors import IndeterminateError
from shardsink.workloads import Workload
from tests.helpers.server import serving

WORKLOAD = Workload("churn", rows_per_interval=20)
ALL_BLOB = ShardConfig(inline_max_bytes=0)


def test_a_shard_cannot_commit_or_so_delete_another_shards_part(tmp_path):
    """Shard ``evil`` appending a batch that names ``victim``'s part key used
    to commit it; compacting and collecting ``evil`` then deleted the part
    and ``victim``'s reads failed. Now the key is refused: it is not under
    ``evil``'s writer's prefix."""
    blob_uri = f"file://{tmp_path}/blob"
    with (
        serving(tmp_path, open_blob(blob_uri)) as server,
        open_shard(
            "victim", blob=blob_uri, consensus=server.address, config=ALL_BLOB, create=True
        ) as victim,
        open_shard(
            "evil", blob=blob_uri, consensus=server.address, config=ALL_BLOB, create=True
        ) as evil,
    ):
        victim.writer().compare_and_append_table(WORKLOAD.updates(0), 0, 1000)
        (stolen,) = victim.state().ordered_batches()[0].parts
        forged = Batch(id=uuid.uuid4().hex, lower=0, upper=1000, parts=(stolen,), rows=stolen.rows)
        writer = evil.writer()
        with pytest.raises(ValueError, match=r"is not under writer .* prefix 'evil/part/"):
            writer.compare_and_append([forged], 0, 1000)
        evil.writer().compare_and_append_table(WORKLOAD.updates(0), 0, 1000)
        evil.compact()
        evil.collect_garbage()
        assert victim.snapshot().equals(WORKLOAD.expected(1))
        assert victim.verify().ok


def test_the_sweep_through_a_server_refuses_a_grace_below_the_writer_lease(tmp_path):
    """``shard gc --sweep-grace-ms 0`` was accepted against a live server and
    deleted parts on their way into an append."""
    blob_uri = f"file://{tmp_path}/blob"
    with (
        serving(tmp_path, open_blob(blob_uri)) as server,
        open_shard(
            "s", blob=blob_uri, consensus=server.address, config=ALL_BLOB, create=True
        ) as shard,
    ):
        writer = shard.writer()
        batch = writer.batch(WORKLOAD.updates(0), 0, 1000)
        with pytest.raises(ValueError, match="shorter than the writer lease"):
            shard.sweep_leaked_blobs(0)
        assert shard.sweep_leaked_blobs(server.config.writer_lease_ms) == []
        assert writer.compare_and_append([batch], 0, 1000) == 1000


def _tcp_server(tmp_path) -> ConsensusServer:
    return ConsensusServer(
        open_consensus(f"sqlite://{tmp_path}/c.db"),
        open_blob(f"file://{tmp_path}/blob"),
        "tcp://127.0.0.1:0",
        keys=server_keys(tmp_path / "keys"),
        gc_interval_s=0,
        sweep_interval_s=0,
    )


def _answers(address: str, keys: ClientKeys | None) -> bool:
    """Whether a raw DEALER with ``keys`` (or none) gets a reply to a ping."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys
        sock.connect(address)
        sock.send((1).to_bytes(8, "big") + encode(Ping()))
        return bool(sock.poll(1500))
    finally:
        sock.close()
        ctx.term()


def test_a_tcp_server_answers_only_clients_with_its_curve_key(tmp_path):
    """A ``tcp://`` bind authenticated no one. Now a client without keys, or
    with a key pair the server was not given, is not answered; the key
    directory's client is."""
    server = _tcp_server(tmp_path)
    stop = threading.Event()
    loop = threading.Thread(target=server.serve, args=(stop,))
    loop.start()
    try:
        good = client_keys(tmp_path / "keys", server.address)
        public, secret = zmq.curve_keypair()
        stranger = ClientKeys(good.server, public, secret)
        assert not _answers(server.address, None)
        assert not _answers(server.address, stranger)
        assert _answers(server.address, good)
        client = ServerClient(server.address, timeout_s=1.5, retry_for_s=0, keys=stranger)
        with pytest.raises(IndeterminateError, match="no reply"):
            client.request(RunCommand("s", ExpireReaders()))
        client.close()
        with pytest.raises(ValueError, match="accepts only CURVE clients"):
            ServerClient(server.address)  # no key directory named
    finally:
        stop.set()
        loop.join(30)
        server.close()
    assert not loop.is_alive()


def test_a_tcp_bind_without_keys_is_refused(tmp_path):
    with (
        contextlib.closing(open_consensus(f"sqlite://{tmp_path}/c.db")) as store,
        contextlib.closing(open_blob(f"file://{tmp_path}/blob")) as blob,
        pytest.raises(ValueError, match="needs CURVE keys"),
    ):
        ConsensusServer(store, blob, "tcp://127.0.0.1:0")
