"""A shard's rollup threshold, leaked-blob grace and max attempts on a
consensus server are the server's, for every client and across restarts: a
client asking for others is refused with both values named, never overruled
in silence by whoever opened the shard first; a client that leaves them at
their defaults asks for nothing and gets the server's."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shardsink import open_shard
from shardsink.persist.config import ShardConfig
from shardsink.process import ConsensusProcess
from shardsink.server.config import ServeConfig
from shardsink.workloads import Workload
from tests.helpers.wait import wait_until

WORKLOAD = Workload("trickle", rows_per_interval=4, interval_ms=1)
#: The server's writer lease, and the shortest grace it allows the sweep.
LEASE_MS = 60_000
SERVED = ShardConfig(rollup_threshold=4, leaked_blob_grace_ms=LEASE_MS, max_attempts=8)


def _server(tmp_path: Path, **settings) -> ConsensusProcess:
    return ConsensusProcess(
        f"sqlite://{tmp_path}/consensus.db",
        f"file://{tmp_path}/blob",
        ServeConfig(bind=f"ipc://{tmp_path}/sock/consensus", **settings),
    )


@pytest.mark.parametrize(
    ("name", "value"), [("rollup_threshold", 4), ("leaked_blob_grace_ms", 0), ("max_attempts", 3)]
)
def test_a_second_client_asking_for_other_settings_is_refused(tmp_path, name, value) -> None:
    blob = f"file://{tmp_path}/blob"
    asked = ShardConfig(**{name: value})
    default = getattr(ShardConfig(), name)
    with (
        _server(tmp_path) as server,
        open_shard("s", blob=blob, consensus=server.address, create=True) as first,
    ):
        first.writer().compare_and_append_table(WORKLOAD.updates(0), 0, 1)
        with pytest.raises(ValueError) as refused:
            open_shard("s", blob=blob, consensus=server.address, config=asked, create=True)
        message = str(refused.value)
        assert f"shard 's': asked for {name}={value}" in message
        assert f"{name}={default} (--{name.replace('_', '-')})" in message
        # the first client goes on as before
        assert first.writer().compare_and_append_table(WORKLOAD.updates(1), 1, 2) == 2


def test_the_servers_settings_hold_for_every_shard_and_after_a_restart(tmp_path) -> None:
    blob = f"file://{tmp_path}/blob"
    server = _server(
        tmp_path,
        rollup_threshold=4,
        leaked_blob_grace_ms=LEASE_MS,
        max_attempts=8,
        writer_lease_ms=LEASE_MS,
        sweep_interval_s=0.1,
    )
    with server:
        with pytest.raises(ValueError, match=r"rollup_threshold=5, max_attempts=9"):
            other = ShardConfig(rollup_threshold=5, max_attempts=9)
            open_shard("s", blob=blob, consensus=server.address, config=other, create=True)
        with open_shard(
            "s", blob=blob, consensus=server.address, config=SERVED, create=True
        ) as shard:
            writer = shard.writer()
            for i in range(6):
                writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
            assert len(shard.state().rollups) >= 2  # one every 4 versions, not every 128
            server.kill()
            server.start()  # the shard now loads on the first command, not an open
            seqno = shard.state().seqno
            while shard.state().seqno < seqno + 5:
                i = shard.upper
                writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
            rollups = sorted(shard.state().rollups)
            assert rollups[-1] > seqno, f"no rollup after the restart: {rollups}"
            # parts of a writer that left state: one older than the server's
            # grace, one younger; and an old one of a writer still registered
            part = Path(f"{tmp_path}/blob/s/part")
            young, leaked = part / "gone.1" / "young.parquet", part / "gone.1" / "old.parquet"
            held = part / writer.writer_id / "held.parquet"
            past_grace = time.time() - LEASE_MS / 1000 - 60
            for path in (young, leaked, held):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"x")
            for path in (leaked, held):
                os.utime(path, (past_grace, past_grace))
            # swept on the server's schedule, with its grace
            wait_until(lambda: not leaked.exists(), 30, "the sweep of the leaked blob")
            assert young.exists() and held.exists()


def test_a_server_refuses_a_sweep_grace_below_its_writer_lease(tmp_path) -> None:
    """A grace shorter than the lease could sweep a live writer's parts
    before their append: such a server's settings are refused, naming both,
    before any process starts."""
    with pytest.raises(ValueError) as refused:
        _server(tmp_path, writer_lease_ms=LEASE_MS, leaked_blob_grace_ms=LEASE_MS - 1)
    message = str(refused.value)
    assert f"grace ({LEASE_MS - 1} ms) is shorter than the writer lease ({LEASE_MS} ms)" in message
    assert f"give a grace of at least {LEASE_MS} ms" in message


def test_a_client_with_the_defaults_takes_the_servers_settings(tmp_path) -> None:
    """A client that asks for nothing (a plain ``shardsink read``) is served
    with the server's values, not refused; one that asks for others is."""
    blob = f"file://{tmp_path}/blob"
    with _server(tmp_path, rollup_threshold=4) as server:
        with open_shard("s", blob=blob, consensus=server.address, create=True) as shard:
            for i in range(6):
                shard.writer().compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
            assert len(shard.state().rollups) >= 2  # one every 4 versions, not every 128
        other = ShardConfig(rollup_threshold=5)
        with pytest.raises(ValueError, match="rollup_threshold=5"):
            open_shard("s", blob=blob, consensus=server.address, config=other, create=True)
