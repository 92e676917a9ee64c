"""``Consensus`` in one SQLite file: ``sqlite:///absolute/path.db[?busy_timeout=SECONDS]``.

The embedded default. The file is in WAL mode with ``synchronous=FULL``, so a
committed compare-and-set survives a power loss, and readers never wait for the
writer. Writes run in ``BEGIN IMMEDIATE`` transactions: the write lock is taken
up front, so two writers never both read the head and then both insert.

A database this creates is 0600, and so are its ``-wal`` and ``-shm`` files:
the shard's state is its owner's only.

Several processes may open the same file, each with its own
``SqliteConsensus``; a writer waits up to ``busy_timeout`` seconds (default 5)
for another process's write lock. One instance may be shared by threads (calls
are serialized on its single connection), but not across ``fork``: open one in
each process.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from .contracts import (
    CasRequest,
    CasResult,
    Committed,
    Mismatch,
    VersionedData,
    check_cas_args,
    check_cas_batch,
    check_truncate_args,
)
from .errors import DeterminateError, IndeterminateError, StorageError
from .uri import bad_uri

T = TypeVar("T")
#: The pause between tries to prepare a file another process holds locked.
OPEN_RETRY_S = 0.01

_SCHEMA = """
CREATE TABLE IF NOT EXISTS consensus (
    shard TEXT NOT NULL,
    seqno INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (shard, seqno)
) WITHOUT ROWID
"""
#: Shards per ``IN (...)`` list: within SQLite's oldest bound on variables (999).
_IN_MOST = 500
_INSERT = "INSERT INTO consensus (shard, seqno, data) VALUES (?, ?, ?)"
_HEAD = "SELECT seqno, data FROM consensus WHERE shard = ? ORDER BY seqno DESC LIMIT 1"


def _head(conn: sqlite3.Connection, shard: str) -> VersionedData | None:
    row = conn.execute(_HEAD, (shard,)).fetchone()
    return None if row is None else VersionedData(row[0], bytes(row[1]))


def _head_seqnos(conn: sqlite3.Connection, shards: list[str]) -> dict[str, int]:
    """The head seqno of each of ``shards`` that has a version: one statement
    per :data:`_IN_MOST` shards, reading no payload, each shard's ``max`` a
    single lookup in the primary key's index. Why not ``max(seqno) ... GROUP
    BY shard``: it reads every version of every shard, a cost that grows
    with the state (793 us against 32 for 32 shards of 300 versions each,
    by hand)."""
    heads: dict[str, int] = {}
    for start in range(0, len(shards), _IN_MOST):
        chunk = shards[start : start + _IN_MOST]
        marks = ",".join(["(?)"] * len(chunk))
        rows = conn.execute(
            "SELECT v.column1, (SELECT max(seqno) FROM consensus WHERE shard = v.column1) "
            f"FROM (VALUES {marks}) AS v",
            chunk,
        ).fetchall()
        heads.update((shard, seqno) for shard, seqno in rows if seqno is not None)
    return heads


class SqliteConsensus:
    """A ``Consensus`` stored in the SQLite file ``path`` (see the module docstring).

    Errors: failing to open the file, to take the write lock within
    ``busy_timeout`` ("database is locked") or any failure before COMMIT is a
    :class:`DeterminateError` (nothing was committed); a failed COMMIT is an
    :class:`IndeterminateError`. Calls after ``close()`` raise ``ValueError``.
    """

    def __init__(self, path: str | Path, busy_timeout: float = 5.0, uri: str | None = None):
        self.path = Path(path).absolute()
        self.uri = uri or f"sqlite://{self.path}"
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._closed = False
        self._conn: sqlite3.Connection | None = self._open()

    @classmethod
    def from_uri(cls, uri: str) -> SqliteConsensus:
        """Open ``sqlite:///absolute/path.db``; ``ValueError`` for a malformed URI, a
        relative path, a path that is a directory or a missing parent directory."""
        parts = urlsplit(uri)
        if parts.scheme.lower() != "sqlite":
            raise bad_uri(uri, "consensus", "not a sqlite:// URI")
        if parts.netloc:
            raise bad_uri(
                uri,
                "consensus",
                f"unexpected host {parts.netloc!r}; a sqlite URI has no host and an "
                "absolute path, i.e. three slashes: sqlite:///absolute/path.db",
            )
        path = Path(unquote(parts.path))
        if not path.is_absolute():
            raise bad_uri(uri, "consensus", "the database path must be absolute")
        busy_timeout = 5.0
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name != "busy_timeout":
                raise bad_uri(uri, "consensus", f"unknown parameter {name!r} (known: busy_timeout)")
            try:
                busy_timeout = float(value)
                if busy_timeout < 0:
                    raise ValueError(value)
            except ValueError:
                why = f"busy_timeout must be seconds >= 0, got {value!r}"
                raise bad_uri(uri, "consensus", why) from None
        if path.is_dir():
            raise bad_uri(uri, "consensus", f"{path} is a directory, not a database file")
        if not path.parent.is_dir():
            raise bad_uri(uri, "consensus", f"directory {path.parent} does not exist")
        return cls(path, busy_timeout=busy_timeout, uri=uri)

    def _fail(self, kind: type[StorageError], what: str, exc: sqlite3.Error) -> StorageError:
        detail = str(exc)
        if _busy(exc):
            detail += (
                f" (another connection held the write lock for the whole "
                f"{self.busy_timeout:g}s busy timeout)"
            )
        outcome = (
            "nothing was committed"
            if kind is DeterminateError
            else "the commit may or may not have taken effect; re-read the head"
        )
        return kind(f"sqlite consensus {self.path}: {what} failed: {detail}; {outcome}")

    def _create_private(self) -> None:
        """Create the database file 0600 if it is missing: SQLite would create
        it 0644 (less the umask), and gives the ``-wal`` and ``-shm`` files the
        database file's mode."""
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise DeterminateError(f"sqlite consensus {self.path}: cannot create: {exc}") from exc

    def _open(self) -> sqlite3.Connection:
        self._create_private()
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise self._fail(DeterminateError, "open", exc) from exc
        # Switching a new file to WAL takes an exclusive lock without SQLite's
        # busy handler: two processes opening it at once had one fail at once.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                self._prepare(conn)
                return conn
            except sqlite3.Error as exc:
                if _busy(exc) and time.monotonic() < deadline:
                    time.sleep(OPEN_RETRY_S)
                    continue
                conn.close()
                raise self._fail(DeterminateError, "open", exc) from exc
            except BaseException:
                conn.close()
                raise

    def _prepare(self, conn: sqlite3.Connection) -> None:
        (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode.lower() != "wal":
            raise DeterminateError(
                f"sqlite consensus {self.path}: cannot enable WAL mode (got {mode!r}); "
                "is the file on a filesystem without shared memory support?"
            )
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(_SCHEMA)

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise ValueError(f"sqlite consensus {self.uri} is closed")
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _discard_transaction(self, conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            # A connection that cannot roll back is unusable; the next call reopens.
            conn.close()
            self._conn = None

    def _read(self, what: str, body: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            conn = self._connection()
            try:
                return body(conn)
            except sqlite3.Error as exc:
                raise self._fail(DeterminateError, what, exc) from exc

    def _write(self, what: str, body: Callable[[sqlite3.Connection], tuple[T, bool]]) -> T:
        """Run ``body`` in a ``BEGIN IMMEDIATE`` transaction; commit if it returns
        ``(result, True)``, roll back if ``(result, False)`` or if it raises."""
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self._discard_transaction(conn)
                raise self._fail(DeterminateError, what, exc) from exc
            try:
                result, commit = body(conn)
            except sqlite3.Error as exc:
                self._discard_transaction(conn)
                raise self._fail(DeterminateError, what, exc) from exc
            except BaseException:
                self._discard_transaction(conn)
                raise
            if not commit:
                self._discard_transaction(conn)
                return result
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._discard_transaction(conn)
                raise self._fail(IndeterminateError, what, exc) from exc
            return result

    def head(self, shard: str) -> VersionedData | None:
        return self._read("head", lambda conn: _head(conn, shard))

    def compare_and_set(self, shard: str, expected: int | None, new: VersionedData) -> CasResult:
        check_cas_args(expected, new)
        # A plain read settles most mismatches without queueing for the write lock.
        current = self.head(shard)
        if (current.seqno if current else None) != expected:
            return Mismatch(current)

        def cas(conn: sqlite3.Connection) -> tuple[CasResult, bool]:
            current = _head(conn, shard)
            if (current.seqno if current else None) != expected:
                return Mismatch(current), False
            conn.execute(_INSERT, (shard, new.seqno, bytes(new.data)))
            return Committed(new.seqno), True

        return self._write("compare_and_set", cas)

    def compare_and_set_many(self, requests: Sequence[CasRequest]) -> list[CasResult]:
        """One ``BEGIN IMMEDIATE`` transaction for the whole batch: one commit,
        so one fsync (``synchronous=FULL``) for every version it stores."""
        check_cas_batch(requests)
        if not requests:
            return []

        def cas_all(conn: sqlite3.Connection) -> tuple[list[CasResult], bool]:
            heads = _head_seqnos(conn, [r.shard for r in requests])
            results: list[CasResult] = []
            rows = []
            for request in requests:
                if heads.get(request.shard) != request.expected:
                    results.append(Mismatch(_head(conn, request.shard)))
                    continue
                results.append(Committed(request.new.seqno))
                rows.append((request.shard, request.new.seqno, bytes(request.new.data)))
            conn.executemany(_INSERT, rows)
            return results, bool(rows)

        return self._write("compare_and_set_many", cas_all)

    def compare_and_set_all(self, requests: Sequence[CasRequest]) -> list[CasResult]:
        """One ``BEGIN IMMEDIATE`` transaction (writers are serialized): every
        head checked, then every version inserted, or none."""
        check_cas_batch(requests)
        if not requests:
            return []

        def cas_all(conn: sqlite3.Connection) -> tuple[list[CasResult], bool]:
            heads = _head_seqnos(conn, [r.shard for r in requests])
            if any(heads.get(r.shard) != r.expected for r in requests):
                return [Mismatch(_head(conn, r.shard)) for r in requests], False
            rows = [(r.shard, r.new.seqno, bytes(r.new.data)) for r in requests]
            conn.executemany(_INSERT, rows)
            return [Committed(r.new.seqno) for r in requests], True

        return self._write("compare_and_set_all", cas_all)

    def scan(self, shard: str, from_seqno: int, limit: int) -> list[VersionedData]:
        if limit < 0:
            raise ValueError(f"scan: limit must be >= 0, got {limit}")
        rows = self._read(
            "scan",
            lambda conn: conn.execute(
                "SELECT seqno, data FROM consensus WHERE shard = ? AND seqno >= ? "
                "ORDER BY seqno LIMIT ?",
                (shard, from_seqno, limit),
            ).fetchall(),
        )
        return [VersionedData(seqno, bytes(data)) for seqno, data in rows]

    def truncate(self, shard: str, below_seqno: int) -> int:
        def delete(conn: sqlite3.Connection) -> tuple[int, bool]:
            check_truncate_args(shard, _head(conn, shard), below_seqno)
            cursor = conn.execute(
                "DELETE FROM consensus WHERE shard = ? AND seqno < ?", (shard, below_seqno)
            )
            return cursor.rowcount, True

        return self._write("truncate", delete)

    def list_shards(self) -> list[str]:
        rows = self._read(
            "list_shards",
            lambda conn: conn.execute(
                "SELECT DISTINCT shard FROM consensus ORDER BY shard"
            ).fetchall(),
        )
        return [shard for (shard,) in rows]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", "").startswith("SQLITE_BUSY")
