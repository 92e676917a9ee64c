"""One conformance suite for every ``Consensus`` backend, against real engines.

``memory`` runs in this process; ``sqlite`` uses a file under ``tmp_path``;
``postgres`` a fresh database on the session's real PostgreSQL server. The
multi-process race runs on sqlite and postgres only: a memory store is private
to its process, so separate processes cannot race on it.
"""

from __future__ import annotations

import json
import re
import select
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import psycopg
import pytest

from shardsink._address import free_port
from shardsink.storage import (
    CasRequest,
    Committed,
    Consensus,
    DeterminateError,
    IndeterminateError,
    Mismatch,
    VersionedData,
    open_consensus,
)

ALL = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SHARED_ACROSS_PROCESSES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _uri(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "memory":
        return f"memory://conformance-{uuid.uuid4().hex}"
    if kind == "sqlite":
        return f"sqlite://{tmp_path}/consensus.db"
    return request.getfixturevalue("postgres_server").new_database()


@pytest.fixture(params=ALL)
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of each backend."""
    return _uri(request.param, request, tmp_path)


@pytest.fixture(params=SHARED_ACROSS_PROCESSES)
def shared_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store that several processes can open."""
    return _uri(request.param, request, tmp_path)


@pytest.fixture
def store(uri: str):
    store = open_consensus(uri)
    yield store
    store.close()


def v(seqno: int, data: bytes | None = None) -> VersionedData:
    return VersionedData(seqno, data if data is not None else f"v{seqno}".encode())


def fill(store: Consensus, shard: str, n: int, first: int = 0) -> None:
    for seqno in range(first, first + n):
        expected = None if seqno == first else seqno - 1
        assert store.compare_and_set(shard, expected, v(seqno)) == Committed(seqno)


# --- the contract ------------------------------------------------------------


def test_open_store_satisfies_the_protocol(store):
    assert isinstance(store, Consensus)


def test_head_of_unknown_shard_is_none(store):
    assert store.head("nope") is None
    assert store.scan("nope", 0, 10) == []


def test_first_version_from_none(store):
    assert store.compare_and_set("s", None, v(0, b"\x00first\xff")) == Committed(0)
    assert store.head("s") == v(0, b"\x00first\xff")
    # A shard may start at any seqno >= 0 (e.g. restored from a rollup).
    assert store.compare_and_set("t", None, v(7)) == Committed(7)
    assert store.head("t") == v(7)
    assert store.compare_and_set("t", 7, v(8)) == Committed(8)


def test_wrong_new_seqno_is_value_error_and_stores_nothing(store):
    with pytest.raises(ValueError, match="seqno >= 0"):
        store.compare_and_set("s", None, v(-1))
    fill(store, "s", 2)
    for bad in (0, 1, 3):
        with pytest.raises(ValueError, match="expected \\+ 1"):
            store.compare_and_set("s", 1, v(bad))
    assert store.head("s") == v(1)


def test_mismatch_is_a_return_value_carrying_the_actual_head(store):
    assert store.compare_and_set("s", 0, v(1)) == Mismatch(None)
    fill(store, "s", 3)
    assert store.compare_and_set("s", None, v(0)) == Mismatch(v(2))
    assert store.compare_and_set("s", 1, v(2, b"late")) == Mismatch(v(2))
    assert store.compare_and_set("s", 5, v(6)) == Mismatch(v(2))
    assert store.scan("s", 0, 10) == [v(0), v(1), v(2)]


def test_scan_order_from_seqno_and_limit(store):
    fill(store, "s", 10)
    fill(store, "other", 3)
    assert store.scan("s", 0, 100) == [v(i) for i in range(10)]
    assert store.scan("s", 4, 3) == [v(4), v(5), v(6)]
    assert store.scan("s", -5, 2) == [v(0), v(1)]
    assert store.scan("s", 9, 5) == [v(9)]
    assert store.scan("s", 10, 5) == []
    assert store.scan("s", 0, 0) == []
    with pytest.raises(ValueError, match="limit"):
        store.scan("s", 0, -1)


def test_truncate_removes_below_never_the_head(store):
    with pytest.raises(ValueError, match="no version"):
        store.truncate("s", 0)
    fill(store, "s", 6)
    fill(store, "other", 3)
    assert store.truncate("s", 3) == 3
    assert store.scan("s", 0, 100) == [v(3), v(4), v(5)]
    assert store.truncate("s", 3) == 0
    assert store.truncate("s", 1) == 0
    with pytest.raises(ValueError, match="past the head"):
        store.truncate("s", 6)
    assert store.truncate("s", 5) == 2
    assert store.scan("s", 0, 100) == [v(5)]
    assert store.head("s") == v(5)
    assert store.compare_and_set("s", 5, v(6)) == Committed(6)
    assert store.scan("other", 0, 100) == [v(0), v(1), v(2)]


def test_list_shards_lists_shards_with_versions(store):
    assert store.list_shards() == []
    fill(store, "b", 1)
    fill(store, "a", 2)
    store.compare_and_set("never", 3, v(4))
    assert store.list_shards() == ["a", "b"]


def test_close_is_idempotent(uri):
    store = open_consensus(uri)
    store.close()
    store.close()


def test_versions_persist_across_reopen(uri):
    first = open_consensus(uri)
    fill(first, "s", 3)
    first.truncate("s", 1)
    first.close()
    second = open_consensus(uri)
    try:
        assert second.head("s") == v(2)
        assert second.scan("s", 0, 10) == [v(1), v(2)]
        assert second.compare_and_set("s", 2, v(3)) == Committed(3)
    finally:
        second.close()


def test_concurrent_first_versions_with_different_seqnos_commit_once(uri):
    """Racers on an empty shard may propose different seqnos, so they need not
    collide on (shard, seqno); still exactly one may commit."""
    clients = [open_consensus(uri) for _ in range(6)]
    barrier = threading.Barrier(len(clients))
    results: dict[int, object] = {}

    def race(i: int) -> None:
        barrier.wait(10)
        results[i] = clients[i].compare_and_set("s", None, v(i * 10))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        winners = [i for i, r in results.items() if isinstance(r, Committed)]
        assert len(results) == len(clients) and len(winners) == 1
        head = clients[0].head("s")
        assert head == v(winners[0] * 10)
        assert clients[0].scan("s", 0, 100) == [head]
        assert all(r == Mismatch(head) for r in results.values() if isinstance(r, Mismatch))
    finally:
        for c in clients:
            c.close()


# --- group commit: compare_and_set_many ----------------------------------------


def test_batch_gives_each_request_its_own_result(store):
    """A mismatch fails only its own request; the others commit, in order."""
    fill(store, "a", 2)
    fill(store, "b", 3)
    fill(store, "d", 1)
    results = store.compare_and_set_many(
        [
            CasRequest("a", 1, v(2, b"a2")),
            CasRequest("b", 5, v(6)),  # b's head is 2
            CasRequest("c", None, v(7, b"c7")),  # a first version, any seqno
            CasRequest("d", None, v(3)),  # d has versions
            CasRequest("e", 0, v(1)),  # e has none
        ]
    )
    assert results == [
        Committed(2),
        Mismatch(v(2)),
        Committed(7),
        Mismatch(v(0)),
        Mismatch(None),
    ]
    assert store.scan("a", 0, 10) == [v(0), v(1), v(2, b"a2")]
    assert store.head("b") == v(2) and store.head("d") == v(0) and store.head("e") is None
    assert store.scan("c", 0, 10) == [v(7, b"c7")]


def test_batch_stores_payloads_as_given_never_merged(store):
    payloads = {f"s{i}": bytes(range(i, i + 50)) * (i + 1) for i in range(8)}
    results = store.compare_and_set_many(
        [CasRequest(shard, None, v(0, data)) for shard, data in payloads.items()]
    )
    assert results == [Committed(0)] * len(payloads)
    for shard, data in payloads.items():
        assert store.scan(shard, 0, 10) == [v(0, data)]
    assert store.list_shards() == sorted(payloads)


def test_batch_arguments_are_checked_before_anything_is_stored(store):
    fill(store, "a", 1)
    with pytest.raises(ValueError, match="appears twice"):
        store.compare_and_set_many([CasRequest("b", None, v(0)), CasRequest("b", 0, v(1))])
    with pytest.raises(ValueError, match="expected \\+ 1"):
        store.compare_and_set_many([CasRequest("b", None, v(0)), CasRequest("a", 0, v(5))])
    assert store.head("b") is None and store.head("a") == v(0)
    assert store.compare_and_set_many([]) == []


def test_all_mismatched_batch_stores_nothing(store):
    fill(store, "a", 2)
    assert store.compare_and_set_many([CasRequest("a", 0, v(1))]) == [Mismatch(v(1))]
    assert store.scan("a", 0, 10) == [v(0), v(1)]


def test_racing_batches_lose_and_duplicate_nothing(uri):
    """Threads, each with its own store, commit batches over the same shards:
    every shard's log stays gapless and holds exactly the versions reported
    committed, each with its committer's payload."""
    shards = [f"s{i}" for i in range(4)]
    clients = [open_consensus(uri) for _ in range(4)]
    barrier = threading.Barrier(len(clients))
    committed: dict[int, list[tuple[str, int]]] = {}

    def race(i: int) -> None:
        mine = committed.setdefault(i, [])
        store = clients[i]
        barrier.wait(10)
        for _ in range(25):
            heads = {shard: store.head(shard) for shard in shards}
            batch = [
                CasRequest(
                    shard,
                    None if head is None else head.seqno,
                    v(0 if head is None else head.seqno + 1, f"{i}:{shard}".encode()),
                )
                for shard, head in heads.items()
            ]
            for request, result in zip(batch, store.compare_and_set_many(batch), strict=True):
                if isinstance(result, Committed):
                    mine.append((request.shard, request.new.seqno))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert len(committed) == len(clients)
        for shard in shards:
            log = clients[0].scan(shard, 0, 1000)
            assert [x.seqno for x in log] == list(range(len(log)))
            winners = {seqno: i for i, got in committed.items() for s, seqno in got if s == shard}
            assert sorted(winners) == [x.seqno for x in log]
            assert all(x.data == f"{winners[x.seqno]}:{shard}".encode() for x in log)
    finally:
        for c in clients:
            c.close()


# --- transactions across shards: compare_and_set_all ------------------------


def test_all_or_nothing_commits_every_request_when_every_head_matches(store):
    fill(store, "a", 2)
    fill(store, "b", 1)
    results = store.compare_and_set_all(
        [CasRequest("a", 1, v(2, b"a2")), CasRequest("b", 0, v(1, b"b1")),
         CasRequest("c", None, v(0, b"c0"))]
    )  # fmt: skip
    assert results == [Committed(2), Committed(1), Committed(0)]
    assert store.head("a") == v(2, b"a2") and store.head("b") == v(1, b"b1")
    assert store.head("c") == v(0, b"c0")


def test_one_mismatch_commits_nothing_and_names_every_head(store):
    """A mismatch on any shard stores nothing, a new shard's first version
    included, and every result is the shard's head, the matching ones too."""
    fill(store, "a", 2)
    fill(store, "b", 3)
    results = store.compare_and_set_all(
        [CasRequest("a", 1, v(2)), CasRequest("b", 1, v(2)), CasRequest("n", None, v(0))]
    )
    assert results == [Mismatch(v(1)), Mismatch(v(2)), Mismatch(None)]
    assert [x.seqno for x in store.scan("a", 0, 10)] == [0, 1]
    assert [x.seqno for x in store.scan("b", 0, 10)] == [0, 1, 2]
    assert store.head("n") is None and "n" not in store.list_shards()
    with pytest.raises(ValueError, match="appears twice"):
        store.compare_and_set_all([CasRequest("a", 1, v(2)), CasRequest("a", 1, v(2))])
    assert store.compare_and_set_all([]) == []


def test_racing_transactions_are_all_or_nothing(uri):
    """Threads, each with its own store, commit transactions over
    overlapping shards named in different orders: every shard's log stays
    gapless, and each transaction's versions are in every shard it named or
    in none (each version's payload names its transaction)."""
    shards = ["s0", "s1", "s2"]
    clients = [open_consensus(uri) for _ in range(3)]
    barrier = threading.Barrier(len(clients))
    won: dict[str, set[str]] = {}  # transaction -> its shards, if it committed
    lock = threading.Lock()

    def race(i: int) -> None:
        store = clients[i]
        barrier.wait(10)
        for n in range(20):
            picked = [shards[(i + n + k) % 3] for k in range(2)][:: 1 if n % 2 else -1]
            name = f"{i}.{n}"
            heads = {shard: store.head(shard) for shard in picked}
            batch = [
                CasRequest(shard, None if head is None else head.seqno,
                           v(0 if head is None else head.seqno + 1, name.encode()))
                for shard, head in heads.items()
            ]  # fmt: skip
            results = store.compare_and_set_all(batch)
            kinds = {type(r) for r in results}
            assert len(kinds) == 1, results  # never some committed and some not
            if kinds == {Committed}:
                with lock:
                    won[name] = set(picked)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert won, "no transaction committed"
        found: dict[str, set[str]] = {}
        for shard in shards:
            log = clients[0].scan(shard, 0, 1000)
            assert [x.seqno for x in log] == list(range(len(log)))
            for version in log:
                found.setdefault(version.data.decode(), set()).add(shard)
        assert found == won
    finally:
        for c in clients:
            c.close()


# --- the race: separate processes, each with its own store ---------------------

RACER = r"""
import json, sys
from pathlib import Path
from shardsink.storage import Committed, VersionedData, open_consensus

uri, shard, writer, rounds, workdir = sys.argv[1:6]
writer, rounds, workdir = int(writer), int(rounds), Path(workdir)
store = open_consensus(uri)
print("ready", flush=True)
if sys.stdin.readline() != "go\n":  # all start at once, on the test's word
    sys.exit("no go signal")
head = store.head(shard)
won, attempts = [], 0
for rnd in range(rounds):
    while True:
        new = VersionedData(0 if head is None else head.seqno + 1, f"{writer}:{rnd}".encode())
        attempts += 1
        result = store.compare_and_set(shard, None if head is None else head.seqno, new)
        if isinstance(result, Committed):
            won.append(new.seqno)
            head = new
            break
        head = result.current
store.close()
(workdir / f"result-{writer}.json").write_text(json.dumps({"won": won, "attempts": attempts}))
"""


def test_processes_racing_compare_and_set_lose_and_duplicate_nothing(shared_uri, tmp_path):
    writers, rounds = 4, 500
    procs = []
    for w in range(writers):
        with open(tmp_path / f"stderr-{w}", "wb") as err:
            argv = [sys.executable, "-c", RACER, shared_uri, "race", str(w), str(rounds)]
            procs.append(
                subprocess.Popen(
                    [*argv, str(tmp_path)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )
    try:
        deadline = time.monotonic() + 60
        for p in procs:  # each says "ready" once it has opened the store
            remaining = max(0.0, deadline - time.monotonic())
            assert select.select([p.stdout], [], [], remaining)[0], (
                "racers did not open the store within 60 s"
            )
            assert p.stdout.readline() == "ready\n", "a racer died while opening the store"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            p.stdin.close()
            p.stdout.close()
    errors = {w: (tmp_path / f"stderr-{w}").read_text() for w in range(writers) if codes[w]}
    assert not errors, f"racers failed: {errors}"

    claimed: dict[int, bytes] = {}
    attempts = 0
    for w in range(writers):
        result = json.loads((tmp_path / f"result-{w}.json").read_text())
        assert len(result["won"]) == rounds
        attempts += result["attempts"]
        for rnd, seqno in enumerate(result["won"]):
            assert seqno not in claimed, f"seqno {seqno} won twice"
            claimed[seqno] = f"{w}:{rnd}".encode()

    store = open_consensus(shared_uri)
    try:
        log = store.scan("race", 0, writers * rounds + 10)
    finally:
        store.close()
    total = writers * rounds
    assert [x.seqno for x in log] == list(range(total)), "gap or duplicate in the log"
    assert {x.seqno: x.data for x in log} == claimed, "log differs from what the winners saw"
    assert len({x.data for x in log}) == total, "a writer+round appears twice"
    assert attempts >= total


# --- the PostgreSQL test server -----------------------------------------------

STARTER = r"""
import sys, time
from shardsink.testing.postgres import PostgresServer
server = PostgresServer(sys.argv[1]).start()
print(server.pids()[0], server._private_dir or "", flush=True)
time.sleep(120)  # to be killed: the server must die with it
"""


@pytest.mark.postgres
def test_postgres_server_dies_with_the_process_that_started_it(postgres_server, tmp_path):
    """The session server works, so binaries are there; start a second one in a
    child, SIGKILL the child, and the server must go too."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        pid, private_dir = starter.stdout.readline().split(" ", 1)
        server = psutil.Process(int(pid))
        starter.kill()
        starter.wait(10)
        server.wait(15)  # psutil.TimeoutExpired if the server outlives its parent
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(10)
        starter.stdout.close()
    if private_dir.strip():
        shutil.rmtree(private_dir.strip(), ignore_errors=True)
    assert not psutil.pid_exists(int(pid))


# --- backend-specific errors --------------------------------------------------


def test_unknown_scheme_names_the_accepted_forms():
    with pytest.raises(ValueError, match="mysql://x") as err:
        open_consensus("mysql://x")
    for form in ("sqlite:///absolute/path.db", "postgresql://", "memory://"):
        assert form in str(err.value)


def test_sqlite_uri_errors(tmp_path):
    with pytest.raises(ValueError, match="three slashes"):
        open_consensus("sqlite://relative.db")
    with pytest.raises(ValueError, match="absolute"):
        open_consensus("sqlite://")
    missing = tmp_path / "no-such-dir"
    with pytest.raises(ValueError, match=re.escape(f"directory {missing} does not exist")):
        open_consensus(f"sqlite://{missing}/c.db")
    with pytest.raises(ValueError, match="is a directory"):
        open_consensus(f"sqlite://{tmp_path}")
    with pytest.raises(ValueError, match="unknown parameter 'mode'"):
        open_consensus(f"sqlite://{tmp_path}/c.db?mode=ro")
    with pytest.raises(ValueError, match="busy_timeout"):
        open_consensus(f"sqlite://{tmp_path}/c.db?busy_timeout=soon")


def test_sqlite_file_that_is_not_a_database_is_determinate(tmp_path):
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(DeterminateError, match=r"junk\.db"):
        open_consensus(f"sqlite://{tmp_path}/junk.db")


def test_sqlite_write_lock_held_past_busy_timeout_is_determinate(tmp_path):
    path = tmp_path / "c.db"
    store = open_consensus(f"sqlite://{path}?busy_timeout=0.2")
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(DeterminateError, match=r"locked.*nothing was committed"):
            store.compare_and_set("s", None, v(0))
        assert time.monotonic() - started >= 0.15
        assert store.head("s") is None  # readers are not blocked in WAL mode
        other.execute("ROLLBACK")
        assert store.compare_and_set("s", None, v(0)) == Committed(0)
    finally:
        other.close()
        store.close()
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_postgres_refused_connection_is_determinate_naming_host_port():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(DeterminateError, match=f"127.0.0.1:{port}"):
        open_consensus(f"postgresql://postgres@127.0.0.1:{port}/postgres?connect_timeout=3")
    assert time.monotonic() - started < 5
    with pytest.raises(DeterminateError, match=f"localhost:{port}"):
        open_consensus(f"postgres://u@localhost:{port}/db")


def test_postgres_malformed_uri_is_value_error():
    with pytest.raises(ValueError, match="invalid consensus URI"):
        open_consensus("postgresql://u@h:5432/db?no_such_param=1")


@pytest.mark.postgres
def test_postgres_lost_connection_is_indeterminate_then_reconnects(postgres_server):
    url = postgres_server.new_database()
    store = open_consensus(url)
    try:
        fill(store, "s", 1)
        (backend,) = store._conn.execute("SELECT pg_backend_pid()").fetchone()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        with pytest.raises(IndeterminateError, match="re-read the head"):
            store.compare_and_set("s", 0, v(1))
        assert store.head("s") == v(0)  # reconnected; the lost insert never reached the server
        assert store.compare_and_set("s", 0, v(1)) == Committed(1)
        (backend,) = store._conn.execute("SELECT pg_backend_pid()").fetchone()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        with pytest.raises(DeterminateError, match="head failed"):
            store.head("s")
        assert store.head("s") == v(1)
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_statement_timeout_during_insert_is_indeterminate(postgres_server):
    url = postgres_server.new_database()
    store = open_consensus(f"{url}?options=-c%20statement_timeout%3D300")
    try:
        fill(store, "s", 1)
        with psycopg.connect(url) as blocker:  # holds seqno 1's key, uncommitted
            blocker.execute(
                "INSERT INTO consensus (shard, seqno, data) VALUES ('s', 1, 'x'::bytea)"
            )
            started = time.monotonic()
            with pytest.raises(IndeterminateError, match="statement timeout"):
                store.compare_and_set("s", 0, v(1))
            assert time.monotonic() - started < 5
            blocker.rollback()
        assert store.compare_and_set("s", 0, v(1)) == Committed(1)
    finally:
        store.close()


# --- shardsink bench consensus --------------------------------------------------


def test_bench_consensus_figures_match_the_store(tmp_path, capsys):
    from shardsink.cli import main

    db, out = tmp_path / "bench.db", tmp_path / "bench.json"
    argv = ["bench", "consensus", "--store", f"sqlite://{db}", "--clients", "1,2"]
    assert main([*argv, "--seconds", "0.5", "--shard", "b", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["clients"] for r in runs] == [1, 2]
    assert all(r["committed"] > 0 and r["errors"] == 0 for r in runs)
    assert all(r["attempts"] == r["committed"] + r["mismatches"] for r in runs)
    store = open_consensus(f"sqlite://{db}")
    try:
        log = store.scan("b", 0, 10**9)
    finally:
        store.close()
    assert [x.seqno for x in log] == list(range(sum(r["committed"] for r in runs)))
    assert "committed/s" in capsys.readouterr().out


def test_bench_consensus_rejects_a_memory_store(capsys):
    from shardsink.cli import main

    assert main(["bench", "consensus", "--store", "memory://x", "--seconds", "0.1"]) == 2
    assert "private to one process" in capsys.readouterr().err
