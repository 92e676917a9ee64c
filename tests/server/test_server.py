"""The consensus server: shard API through it, malformed input, kills and restarts."""

from __future__ import annotations

import random
import threading
import time

import msgspec
import pytest
import zmq

from shardsink import open_shard
from shardsink.persist.commands import (
    CLIENT_COMMANDS,
    COMMAND_DECODER,
    AddRollup,
    ApplyCompaction,
    ExpireReaders,
    ExpireWriters,
    ForgetRetired,
    ForgetRollups,
    Retain,
)
from shardsink.persist.config import ShardConfig
from shardsink.persist.state import Batch
from shardsink.process import ConsensusProcess
from shardsink.server import ServerClient
from shardsink.server.config import ServeConfig
from shardsink.server.wire import ErrorReply, StateReply, WaitForUpper, decode_reply
from shardsink.storage.errors import DeterminateError, IndeterminateError
from shardsink.workloads import Workload

WORKLOAD = Workload("churn", rows_per_interval=8, interval_ms=1)


@pytest.fixture
def server(tmp_path):
    proc = ConsensusProcess(
        f"sqlite://{tmp_path}/consensus.db",
        f"file://{tmp_path}/blob",
        ServeConfig(bind=f"ipc://{tmp_path}/sock/consensus"),
    )
    with proc:
        yield proc


def test_shard_api_works_through_the_server(server, tmp_path) -> None:
    blob = f"file://{tmp_path}/blob"
    with open_shard("s", blob=blob, consensus=server.address, create=True) as shard:
        w = shard.writer()
        for i in range(5):
            w.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
        assert shard.upper == 5
        got = shard.reader().snapshot()
        assert got.equals(WORKLOAD.expected(5))
        stats = shard.stats()
        assert stats.appends == 5
        assert stats.versions >= 5 and stats.diff_bytes > 0
    # a second client sees the same durable state
    with open_shard("s", blob=blob, consensus=server.address, create=True) as again:
        assert again.upper == 5 and again.reader().snapshot().equals(WORKLOAD.expected(5))


def test_listen_wakes_on_append(server, tmp_path) -> None:
    blob = f"file://{tmp_path}/blob"
    with open_shard("s", blob=blob, consensus=server.address, create=True) as shard:
        reader = shard.reader()
        seen: list[tuple[int, int]] = []

        def listen() -> None:
            for event in reader.listen(since=0, timeout=30):
                seen.append((event.lower, event.upper))
                if event.upper >= 3:
                    return

        t = threading.Thread(target=listen)
        t.start()
        w = shard.writer()
        for i in range(3):
            # the listener is waiting in listen by then (nothing tells when it blocks), so
            # the append must wake it, and each append is seen as an event of its own
            time.sleep(0.1)
            w.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
        t.join(30)
        assert not t.is_alive()
        assert seen == [(0, 1), (1, 2), (2, 3)]


def test_stats_command_prints_per_shard_counts(server, tmp_path, capsys) -> None:
    from shardsink.cli import main

    with open_shard(
        "s", blob=f"file://{tmp_path}/blob", consensus=server.address, create=True
    ) as shard:
        shard.writer().compare_and_append_table(WORKLOAD.updates(0), 0, 1)
    assert main(["consensus", "stats", server.address, "--json"]) == 0
    stats = msgspec.json.decode(capsys.readouterr().out)
    (s,) = stats["shards"]
    assert s["shard"] == "s" and s["upper"] == 1 and s["machine"]["versions"] >= 1


MAINTENANCE = [
    ExpireReaders(),
    ExpireWriters(1),
    Retain(1),
    ApplyCompaction(("a",), Batch("o", 0, 1, (), 0), "w.1"),
    AddRollup(1, "s/rollup/forged"),
    ForgetRetired((1,)),
    ForgetRollups(0),
]


def test_every_command_is_a_clients_or_maintenance():
    union = {t.cls for t in msgspec.inspect.type_info(COMMAND_DECODER.type).types}
    assert union == set(CLIENT_COMMANDS) | {type(c) for c in MAINTENANCE}
    assert not set(CLIENT_COMMANDS) & {type(c) for c in MAINTENANCE}


def test_the_server_refuses_maintenance_commands_from_clients(server, tmp_path) -> None:
    """Expiry, retention, compaction, rollups and forgetting retired keys
    are the server's own: a client's command for any of them is refused
    (naming it) and changes nothing; clients ask for maintenance
    (``Maintain``), and the server runs it as its own writer."""
    blob = f"file://{tmp_path}/blob"
    config = ShardConfig(inline_max_bytes=0)  # blob parts, so compaction retires keys
    with open_shard("s", blob=blob, consensus=server.address, config=config, create=True) as shard:
        w = shard.writer()
        for i in range(3):
            w.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
        before = shard.state(refresh=True)
        for command in MAINTENANCE:
            with pytest.raises(ValueError, match=f"{type(command).__name__} is maintenance"):
                shard.machine.run(command)
        assert shard.state(refresh=True) == before
        assert not hasattr(shard.machine, "truncate_below")
        # what a client may ask for instead
        assert shard.compact().applied == 1
        state = shard.state(refresh=True)
        (merged,) = state.batches.values()
        (own,) = set(state.writers) - {w.writer_id}  # the server's, registered for the shard
        assert own.startswith("consensus-") and merged.parts[0].key.startswith(f"s/part/{own}/")
        inputs = {k for b in before.batches.values() for k in b.blob_keys()}
        assert set(shard.collect_garbage().blobs_deleted) == inputs  # retired, held by no one
        lease = ShardConfig().writer_lease_ms
        with pytest.raises(ValueError, match=f"shorter than the writer lease \\({lease} ms\\)"):
            shard.sweep_leaked_blobs(lease - 1)
        assert shard.sweep_leaked_blobs(lease) == []  # everything is young
        assert shard.reader().snapshot().equals(WORKLOAD.expected(3))


def test_nobody_answering_is_a_clear_error(tmp_path) -> None:
    addr = f"ipc://{tmp_path}/nobody"
    config = ShardConfig(server_timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(DeterminateError, match="no consensus server answers at ipc://"):
        open_shard("s", blob=f"file://{tmp_path}/blob", consensus=addr, config=config, create=True)
    assert time.monotonic() - t0 < 5


def _raw_requests(address: str, frames: list[list[bytes]], timeout_s: float) -> list[bytes]:
    """Send raw frames from a DEALER socket, at most ``_WINDOW`` unanswered at a
    time (more would overflow ZeroMQ's queues, which drop instead of block),
    and return every reply's payload (after its 8-byte id). Each frame list
    must draw one reply."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    replies: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        for sent, frames_ in enumerate(frames, 1):
            sock.send_multipart(frames_)
            while sent - len(replies) >= _WINDOW or (sent == len(frames) and len(replies) < sent):
                if time.monotonic() > deadline:
                    return replies
                if sock.poll(200, zmq.POLLIN):
                    replies.append(sock.recv()[8:])
    finally:
        sock.close()
        ctx.term()
    return replies


_WINDOW = 200


def _wrong_messages(rng: random.Random, n: int) -> list[bytes]:
    """Well-formed MessagePack that is not a valid request."""
    batch = {"id": "b", "lower": 0, "upper": 1, "parts": [], "rows": 0}
    run = {
        "type": "run",
        "shard": "s",
        "command": {
            "type": "compare_and_append", "writer_id": "w", "token": "t",
            "batches": [batch], "expected_upper": 0, "new_upper": 1,
        },
    }  # fmt: skip
    templates = [
        {"type": "ping"},
        {"type": "open_shard", "shard": "s", "schema": b"", "config": {}},
        {"type": "fetch_state", "shard": "s"},
        {"type": "wait_for_upper", "shard": "s", "past": 0, "timeout_ms": 0},
        run,
    ]
    junk = [None, -1, 2**63, "x", b"\x00", [], {}, 1.5, True, {"type": "nope"}]
    # every field of these templates rejects a list of None: a sure type error
    wrong_type = [None]
    out = []
    for _ in range(n):
        msg = msgspec.msgpack.decode(msgspec.msgpack.encode(rng.choice(templates)))
        how = rng.randrange(4)
        if how == 0:
            msg["type"] = rng.choice(["", "pong", "run!", "PING", 7])
        elif how == 1:
            msg[rng.choice(["extra", "zzz", "__class__"])] = rng.choice(junk)
        elif how == 2 and len(msg) > 1:
            msg.pop(rng.choice([k for k in msg if k != "type"]))
        else:
            target = msg.get("command", msg)
            key = rng.choice([k for k in target if k != "type"] or ["extra"])
            target[key] = {"type": "nope"} if key == "command" else wrong_type
        out.append(msgspec.msgpack.encode(msg))
    return out


def test_garbage_gets_error_replies_and_the_server_keeps_serving(server, tmp_path) -> None:
    rng = random.Random(4)
    garbage = [rng.randbytes(rng.randrange(0, 200)) for _ in range(10_000)]
    wrong = _wrong_messages(rng, 1_000)
    frames = [[i.to_bytes(8, "big") + p] for i, p in enumerate(garbage + wrong, 1)]
    replies = _raw_requests(server.address, frames, timeout_s=120)
    decoded = [decode_reply(r) for r in replies]
    assert len(decoded) == len(garbage) + len(wrong)
    assert all(isinstance(r, ErrorReply) for r in decoded)
    assert sum(r.kind == "bad_request" for r in decoded) >= 0.99 * len(decoded)
    # frames the server cannot answer (no request id) are dropped, not fatal
    unanswerable = [[b"short"], [b"x" * 8, b"a"], [b""]]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    for frames_ in unanswerable:
        sock.send_multipart(frames_)
    assert not sock.poll(500, zmq.POLLIN)
    sock.close()
    ctx.term()
    assert server.alive()
    with open_shard(
        "s", blob=f"file://{tmp_path}/blob", consensus=server.address, create=True
    ) as shard:
        assert shard.writer().compare_and_append_table(WORKLOAD.updates(0), 0, 1) == 1
    client = ServerClient(server.address)
    try:
        stats = client.stats()
    finally:
        client.close()
    assert stats.errors >= len(garbage) + len(wrong) and stats.dropped == 3


def test_kills_and_restarts_lose_and_double_nothing(tmp_path) -> None:
    """A client streams appends while the server is SIGKILLed at random moments
    20 times and restarted; every acknowledged append lands exactly once. The
    client's own retries are short, so the append's outcome is often unknown
    to the test, which calls it again with the same batch: the writer reuses
    the token, and the token decides (an earlier try that committed answers
    as already appended)."""
    blob = f"file://{tmp_path}/blob"
    proc = ConsensusProcess(
        f"sqlite://{tmp_path}/consensus.db",
        blob,
        ServeConfig(bind=f"ipc://{tmp_path}/sock/consensus"),
    )
    rng = random.Random(20)
    kills = 20
    done = threading.Event()
    errors: list[BaseException] = []

    def nemesis() -> None:
        try:
            for _ in range(kills):
                time.sleep(rng.uniform(0.05, 0.4))  # the fault's random moment
                proc.kill()
                time.sleep(rng.uniform(0.0, 0.1))  # and its random length
                proc.start()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    config = ShardConfig(server_timeout_s=0.5, server_retry_for_s=0.5)
    acked: list[int] = []
    unknown = 0  # appends whose outcome the test did not learn on the first call
    with proc:
        shard = open_shard("k", blob=blob, consensus=proc.address, config=config, create=True)
        try:
            thread = threading.Thread(target=nemesis)
            thread.start()
            writer = shard.writer()
            i = 0
            while not done.is_set() or i < 40:
                batch = writer.batch(WORKLOAD.updates(i), i, i + 1)
                for _attempt in range(200):
                    try:
                        writer.compare_and_append([batch], i, i + 1)
                        break
                    except IndeterminateError:
                        unknown += 1
                        continue  # the same call again: the token decides
                acked.append(i)
                i += 1
            thread.join(60)
            assert not errors, errors
            assert unknown >= 1, "no append's outcome was ever unknown: the token went untested"
            assert proc.starts == kills + 1
            assert acked == list(range(len(acked)))
            assert shard.state(refresh=True).upper == len(acked)
            got = shard.reader().snapshot()
            assert got.equals(WORKLOAD.expected(len(acked)))
        finally:
            shard.close()


def test_a_long_request_to_a_server_that_dies_is_sent_again_at_once(server, tmp_path) -> None:
    """A request that may wait long for its reply (a maintenance job may take
    ten minutes) watches its connection: the server killed and restarted
    under it, the request goes again to the new one at once, not after its
    timeout (35 s here)."""
    blob = f"file://{tmp_path}/blob"
    open_shard("w", blob=blob, consensus=server.address, create=True).close()
    client = ServerClient(server.address, timeout_s=5.0, retry_for_s=60.0)

    def restart() -> None:
        time.sleep(0.5)  # the request is waiting at the server by then (no reply says so)
        server.kill()
        server.start()

    thread = threading.Thread(target=restart)
    started = time.monotonic()
    thread.start()
    try:
        reply = client.request(WaitForUpper("w", 0, 2000), extra_timeout_s=30.0)
    finally:
        thread.join(30)
        client.close()
    assert isinstance(reply, StateReply) and reply.state.upper == 0
    assert client.retries == 1 and server.starts == 2
    assert time.monotonic() - started < 15


def test_error_kinds_map_both_ways() -> None:
    from shardsink.persist.errors import SchemaMismatch
    from shardsink.server.wire import ERROR_KINDS, error_class, error_kind

    for kind, cls in ERROR_KINDS:
        assert error_kind(cls("x")) == kind and error_class(kind) is cls
    assert error_kind(SchemaMismatch("x")) == "bad_request"  # a ValueError
    assert error_kind(RuntimeError("bug")) == "internal"
    assert error_class("internal") is IndeterminateError  # the outcome is unknown
    assert error_class("from a newer server") is IndeterminateError
