"""``Consensus`` in PostgreSQL: ``postgresql://user@host:port/dbname`` (or ``postgres://``).

For clusters that outgrow one machine. Any libpq connection parameter may be
given as a query parameter (``?connect_timeout=2&options=-c%20statement_timeout%3D500``);
unless given, ``connect_timeout`` is 5 s and ``statement_timeout`` 10 s.

Versions live in ``consensus(shard, seqno, data)`` keyed by ``(shard, seqno)``.
A compare-and-set is ONE autocommitted conditional INSERT: it inserts the new
version only if the shard's current max seqno equals ``expected``. Two racers
that both see the same head both try to insert the same ``(shard, seqno)``; the
loser's unique violation is reported as a :class:`Mismatch`. The first version
of a shard (``expected=None``) may have any seqno, so racers need not collide on
the key; there the same statement also claims the shard's row in
``consensus_shards``, on which concurrent first versions do collide. A batch
(``compare_and_set_many``) is one such statement over all its rows.

Tables are created at open if missing. The connection is autocommitted and
reopened on the call after it broke. Calls are serialized on one connection per
instance, so threads may share an instance; open one per process.

``statement_timeout`` is enforced by the server: a server that stops reading
while its socket stays open (e.g. a SIGSTOP'd postmaster) is not detected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

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
from .uri import bad_uri, redact

T = TypeVar("T")

# Serializes CREATE TABLE IF NOT EXISTS between openers: run concurrently, it
# can fail with a unique violation in the system catalogs.
_SCHEMA_LOCK_KEY = 0x73686172_6473696E  # "shardsin"
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS consensus (
        shard text NOT NULL,
        seqno bigint NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (shard, seqno))""",
    "CREATE TABLE IF NOT EXISTS consensus_shards (shard text PRIMARY KEY)",
)
_HEAD = "SELECT seqno, data FROM consensus WHERE shard = %s ORDER BY seqno DESC LIMIT 1"
_APPEND = """
INSERT INTO consensus (shard, seqno, data)
SELECT %(shard)s, %(seqno)s, %(data)s
WHERE (SELECT max(seqno) FROM consensus WHERE shard = %(shard)s) = %(expected)s
"""
_FIRST = """
WITH claimed AS (
    INSERT INTO consensus_shards (shard) VALUES (%(shard)s)
    ON CONFLICT DO NOTHING RETURNING shard)
INSERT INTO consensus (shard, seqno, data)
SELECT shard, %(seqno)s, %(data)s FROM claimed
"""

# A batch as one statement: the first versions claim their shards as _FIRST
# does, the others insert where the shard's max seqno is the expected one; a
# racer that inserted the same (shard, seqno) first makes ON CONFLICT skip the
# row (waiting for it to commit), so the loser is found missing from RETURNING.
_MANY = """
WITH req AS (
    SELECT * FROM unnest(%(shards)s::text[], %(seqnos)s::bigint[], %(datas)s::bytea[],
                         %(expected)s::bigint[]) AS r(shard, seqno, data, expected)),
claimed AS (
    INSERT INTO consensus_shards (shard) SELECT shard FROM req WHERE expected IS NULL
    ON CONFLICT DO NOTHING RETURNING shard)
INSERT INTO consensus (shard, seqno, data)
SELECT r.shard, r.seqno, r.data FROM req r
WHERE (r.expected IS NULL AND r.shard IN (SELECT shard FROM claimed))
   OR r.expected = (SELECT max(c.seqno) FROM consensus c WHERE c.shard = r.shard)
ON CONFLICT DO NOTHING RETURNING shard
"""
# Each shard's head by one backward step of the primary key's index (a
# DISTINCT ON over the shards reads every version of each).
_HEADS = """
SELECT s.shard, c.seqno, c.data FROM unnest(%s::text[]) AS s(shard)
CROSS JOIN LATERAL (
    SELECT seqno, data FROM consensus WHERE shard = s.shard ORDER BY seqno DESC LIMIT 1) c
"""


def _head(conn: psycopg.Connection, shard: str) -> VersionedData | None:
    row = conn.execute(_HEAD, (shard,)).fetchone()
    return None if row is None else VersionedData(row[0], bytes(row[1]))


class PostgresConsensus:
    """A ``Consensus`` in a PostgreSQL database (see the module docstring).

    Errors: a failed (re)connection is a :class:`DeterminateError` naming
    host:port; a lost connection or timeout during a compare-and-set or truncate
    is an :class:`IndeterminateError`, during a read a :class:`DeterminateError`;
    any other server error is a :class:`DeterminateError` (an autocommitted
    statement that failed left nothing behind). Calls after ``close()`` raise
    ``ValueError``. No message, and not ``uri``, shows a password the URI holds.
    """

    def __init__(self, uri: str) -> None:
        self.uri = redact(uri)
        try:
            params = conninfo_to_dict(uri)
        except psycopg.ProgrammingError as exc:
            raise bad_uri(uri, "consensus", redact(str(exc).strip(), uri=uri)) from None
        params.setdefault("connect_timeout", 5)
        params.setdefault("options", "-c statement_timeout=10000")
        params.setdefault("application_name", "shardsink")
        self._conninfo = make_conninfo(**params)
        # Names the server in errors without the password the URI may hold.
        self.where = (
            f"{params.get('host') or 'the default socket'}:{params.get('port') or 5432}"
            f"/{params.get('dbname') or params.get('user') or ''}"
        )
        self._lock = threading.Lock()
        self._closed = False
        self._conn: psycopg.Connection | None = None
        try:
            self._run("create tables", self._create_schema, DeterminateError)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_uri(cls, uri: str) -> PostgresConsensus:
        """Connect to ``postgresql://...``; ``ValueError`` for a malformed URI,
        :class:`DeterminateError` if the server cannot be reached."""
        scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
        if scheme not in ("postgresql", "postgres"):
            raise bad_uri(uri, "consensus", "not a postgresql:// URI")
        return cls(uri)

    @staticmethod
    def _create_schema(conn: psycopg.Connection) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_KEY,))
            for statement in _SCHEMA:
                conn.execute(statement)

    def _connection(self) -> psycopg.Connection:
        if self._closed:
            raise ValueError(f"postgres consensus {self.where} is closed")
        if self._conn is None:
            try:
                self._conn = psycopg.connect(self._conninfo, autocommit=True)
            except psycopg.OperationalError as exc:
                raise DeterminateError(
                    f"cannot connect to PostgreSQL at {self.where}: {str(exc).strip()}"
                ) from exc
        return self._conn

    def _run(
        self, what: str, body: Callable[[psycopg.Connection], T], on_lost: type[StorageError]
    ) -> T:
        with self._lock:
            conn = self._connection()
            try:
                return body(conn)
            except psycopg.OperationalError as exc:
                # Lost connection or statement timeout: the next call starts afresh.
                self._conn = None
                conn.close()
                outcome = (
                    "nothing was changed"
                    if on_lost is DeterminateError
                    else "it may or may not have taken effect; re-read the head"
                )
                raise on_lost(
                    f"postgres consensus {self.where}: {what} failed: {str(exc).strip()}; {outcome}"
                ) from exc
            except psycopg.Error as exc:
                raise DeterminateError(
                    f"postgres consensus {self.where}: {what} failed: {str(exc).strip()}; "
                    "nothing was changed"
                ) from exc

    def head(self, shard: str) -> VersionedData | None:
        return self._run("head", lambda conn: _head(conn, shard), DeterminateError)

    def compare_and_set(self, shard: str, expected: int | None, new: VersionedData) -> CasResult:
        check_cas_args(expected, new)
        params = {"shard": shard, "seqno": new.seqno, "data": bytes(new.data), "expected": expected}

        def cas(conn: psycopg.Connection) -> CasResult:
            try:
                inserted = conn.execute(_FIRST if expected is None else _APPEND, params).rowcount
            except pg_errors.UniqueViolation:
                inserted = 0
            return Committed(new.seqno) if inserted == 1 else Mismatch(_head(conn, shard))

        return self._run("compare_and_set", cas, IndeterminateError)

    def compare_and_set_many(self, requests: Sequence[CasRequest]) -> list[CasResult]:
        """One autocommitted multi-row ``INSERT … ON CONFLICT DO NOTHING
        RETURNING`` for the whole batch; the heads of the requests it did not
        insert are read in one more statement."""
        check_cas_batch(requests)
        if not requests:
            return []
        params = {
            "shards": [r.shard for r in requests],
            "seqnos": [r.new.seqno for r in requests],
            "datas": [bytes(r.new.data) for r in requests],
            "expected": [r.expected for r in requests],
        }

        def cas_all(conn: psycopg.Connection) -> list[CasResult]:
            inserted = {shard for (shard,) in conn.execute(_MANY, params).fetchall()}
            lost = [r.shard for r in requests if r.shard not in inserted]
            heads = {}
            if lost:
                heads = {
                    shard: VersionedData(seqno, bytes(data))
                    for shard, seqno, data in conn.execute(_HEADS, (lost,)).fetchall()
                }
            return [
                Committed(r.new.seqno) if r.shard in inserted else Mismatch(heads.get(r.shard))
                for r in requests
            ]

        return self._run("compare_and_set_many", cas_all, IndeterminateError)

    def compare_and_set_all(self, requests: Sequence[CasRequest]) -> list[CasResult]:
        """:data:`_MANY` in a transaction of its own, committed only if it
        inserted every request's version; else rolled back and every head
        read. The rows go in shard order, one order for every caller, so two
        transactions over the same shards wait on each other's rows in turn
        and never deadlock; a row another transaction inserts first makes
        this one's conflict (``DO NOTHING``), and it rolls back."""
        check_cas_batch(requests)
        if not requests:
            return []
        ordered = sorted(requests, key=lambda r: r.shard)
        params = {
            "shards": [r.shard for r in ordered],
            "seqnos": [r.new.seqno for r in ordered],
            "datas": [bytes(r.new.data) for r in ordered],
            "expected": [r.expected for r in ordered],
        }

        def cas_all(conn: psycopg.Connection) -> list[CasResult]:
            with conn.transaction() as transaction:
                inserted = conn.execute(_MANY, params).fetchall()
                if len(inserted) == len(requests):
                    return [Committed(r.new.seqno) for r in requests]
                raise psycopg.Rollback(transaction)
            heads = {
                shard: VersionedData(seqno, bytes(data))
                for shard, seqno, data in conn.execute(_HEADS, (params["shards"],)).fetchall()
            }
            return [Mismatch(heads.get(r.shard)) for r in requests]

        return self._run("compare_and_set_all", cas_all, IndeterminateError)

    def scan(self, shard: str, from_seqno: int, limit: int) -> list[VersionedData]:
        if limit < 0:
            raise ValueError(f"scan: limit must be >= 0, got {limit}")
        rows = self._run(
            "scan",
            lambda conn: conn.execute(
                "SELECT seqno, data FROM consensus WHERE shard = %s AND seqno >= %s "
                "ORDER BY seqno LIMIT %s",
                (shard, from_seqno, limit),
            ).fetchall(),
            DeterminateError,
        )
        return [VersionedData(seqno, bytes(data)) for seqno, data in rows]

    def truncate(self, shard: str, below_seqno: int) -> int:
        def delete(conn: psycopg.Connection) -> int:
            # The head only grows, so a below_seqno checked against it now can
            # never reach the head when the DELETE runs.
            check_truncate_args(shard, _head(conn, shard), below_seqno)
            return conn.execute(
                "DELETE FROM consensus WHERE shard = %s AND seqno < %s", (shard, below_seqno)
            ).rowcount

        return self._run("truncate", delete, IndeterminateError)

    def list_shards(self) -> list[str]:
        rows = self._run(
            "list_shards",
            lambda conn: conn.execute(
                "SELECT DISTINCT shard FROM consensus ORDER BY shard"
            ).fetchall(),
            DeterminateError,
        )
        return [shard for (shard,) in rows]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
