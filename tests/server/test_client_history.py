"""The history a consensus server's clients record (chaos runs check it for
linearizability): what one process's appends and reads leave in it, and a
request sent again after a timeout recorded as one op per send."""

from __future__ import annotations

import os
import signal
import threading

import pyarrow as pa

import shardsink
from shardsink.chaos import linearizability
from shardsink.persist.config import ShardConfig
from shardsink.process import ConsensusProcess
from shardsink.server import history
from shardsink.server.config import ServeConfig

SCHEMA = pa.schema([("key", pa.int64()), ("val", pa.string())])


def rows(lower: int, n: int) -> pa.Table:
    return pa.table({
        "key": pa.array(range(n), pa.int64()),
        "val": ["x"] * n,
        "ts": pa.array([lower] * n, pa.uint64()),
        "diff": pa.array([1] * n, pa.int64()),
    })  # fmt: skip


def test_a_resend_after_a_timeout_is_an_op_of_its_own(tmp_path, monkeypatch):
    """The server is stopped (SIGSTOP) while an append is sent, past the
    client's timeout: the client sends it again; once continued, the server
    commits the first send and answers a resend ``already``. The history
    has each send as an op, the earlier ones ``info``, and the checker finds
    it linearizable (one op for all sends would be an ``already`` that
    nothing explains)."""
    path = tmp_path / "history.jsonl"
    monkeypatch.setenv(history.HISTORY_ENV, str(path))
    monkeypatch.setenv(history.PROCESS_ENV, "writer")
    blob = f"file://{tmp_path}/blob"
    server = ConsensusProcess(
        f"sqlite://{tmp_path}/c.db", blob, ServeConfig(bind=f"ipc://{tmp_path}/s/c")
    )
    config = ShardConfig(server_timeout_s=0.5, server_retry_for_s=20.0)
    try:
        with (
            server,
            shardsink.open_shard(
                "s", blob=blob, consensus=server.address, schema=SCHEMA, config=config
            ) as shard,
        ):
            writer = shard.writer("w")
            writer.compare_and_append_table(rows(0, 3), 0, 10)
            (pid,) = server.pids()
            os.kill(pid, signal.SIGSTOP)
            resume = threading.Timer(1.8, os.kill, (pid, signal.SIGCONT))
            resume.start()
            try:
                writer.compare_and_append_table(rows(10, 2), 10, 20)
            finally:
                resume.join()
            assert shard.state(refresh=True).upper == 20
    finally:
        history.close_from_environment(path)
    ops = history.load(path)
    appends = [op for op in ops if op.kind == "append"]
    assert appends[0].outcome == "ok" and appends[0].upper == 10
    sends = appends[1:]
    assert len(sends) >= 3, sends  # 1.8 s stopped, 0.5 s a send
    assert {op.token for op in sends} == {sends[0].token}
    assert [op.outcome for op in sends[:-1]] == ["info"] * (len(sends) - 1)
    assert sends[-1].outcome == "already"  # the first send committed, the last was answered
    assert [op.upper for op in ops if op.kind == "read" and op.outcome == "ok"][-1] == 20
    assert {op.process for op in ops} == {"writer"}
    result = linearizability.check(ops)
    assert result.valid, result.lines()
