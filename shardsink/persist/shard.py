"""The shard handle: ``open_shard``, writers and leased readers.

A :class:`Shard` pairs a :class:`~.machine.ShardMachine` (the shard's state)
with the blob store holding its data parts. Writers build batches and
compare-and-append them; readers take a seqno lease before selecting what to
read, so garbage collection cannot delete what they are about to fetch.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple
from urllib.parse import urlsplit

import msgspec
import pyarrow as pa

from .. import faults
from .._address import REMOTE_SCHEMES, check_address
from ..storage.backend import open_blob, open_consensus
from ..storage.contracts import Blob, Consensus
from ..storage.errors import StorageError
from . import parts as P
from . import read
from .batches import (
    build_batch,
    check_interval,
    check_ts,
    delete_unreferenced,
    flush_inline,
    load_part,
)
from .commands import (
    AdvanceSince,
    AlreadyAppended,
    Appended,
    CompareAndAppend,
    ExpireReader,
    ExpireWriter,
    HeartbeatReader,
    HeartbeatWriter,
    InlineCapExceeded,
    Leased,
    LeaseSeqno,
    PartsMissing,
    ReaderExpired,
    RegisterReader,
    Rejected,
    Result,
    WriterGone,
    WrongUpper,
)
from .compaction import CompactionReport
from .config import ShardConfig
from .errors import (
    NotReadable,
    PartMissing,
    PartsNotFound,
    PersistError,
    SchemaMismatch,
    UpperMismatch,
    WriterExpired,
)
from .gc import GcReport
from .machine import LocalMachine, ShardMachine, wall_clock_ms
from .maintenance import LocalMaintenance, Maintenance, register_writer
from .state import Batch, BlobPart, InlinePart, ShardState, check_shard_name
from .stats import ShardStats
from .verify import VerifyReport, verify

log = logging.getLogger(__name__)

#: How many times a read restarts from refreshed state after a part went missing.
PART_RETRIES = 2

#: Rows per record batch of a streamed read.
BATCH_ROWS = 64 * 1024


class ListenEvent(NamedTuple):
    """Updates with ``lower <= ts < upper``, consolidated, sorted by key."""

    lower: int
    upper: int
    updates: pa.Table


#: Opens the shard machine of a consensus server's address (``tcp://``,
#: ``ipc://``): ``(address, shard, schema bytes, config, create)``; the
#: machine is also the shard's :class:`~.maintenance.Maintenance` (the server
#: maintains the shards it holds). The server package has one;
#: :func:`shardsink.connect.open_shard` passes it here.
RemoteOpener = Callable[[str, str, bytes, ShardConfig, bool], ShardMachine]


def open_shard(
    name: str = "default",
    *,
    blob: str | Blob,
    consensus: str | Consensus,
    schema: pa.Schema | None = None,
    config: ShardConfig | None = None,
    create: bool = True,
    clock: Callable[[], int] = wall_clock_ms,
    remote: RemoteOpener | None = None,
) -> Shard:
    """Open (or, with ``create``, create) the shard ``name``.

    ``blob`` and ``consensus`` are URIs (``open_blob``/``open_consensus``
    forms; the handle closes what it opened) or open stores (left open).
    A ``consensus`` of ``tcp://HOST:PORT`` or ``ipc:///path`` names a running
    consensus server (``shardsink consensus serve``), which then applies every
    state change (and whose clock then times leases); ``remote`` opens it
    (``ValueError`` without one: open such a shard with
    :func:`shardsink.open_shard`).
    ``schema`` is the ``key``/``val`` schema (``ts``/``diff`` are added) or the
    full one; ``None`` means the existing shard's schema, or key int64 / val
    string for a new shard. ``clock`` gives milliseconds (leases, sweeps).

    Errors: ``ValueError`` for a bad name, URI or schema;
    :class:`SchemaMismatch` if the shard exists with another schema;
    :class:`~.errors.ShardNotFound` if it does not exist and not ``create``;
    storage errors if a store cannot be reached.
    """
    check_shard_name(name)
    config = config or ShardConfig()
    wanted = None if schema is None else P.full_schema(schema)
    owned: list = []
    try:
        if isinstance(blob, str):
            blob = open_blob(blob)
            owned.append(blob)
        machine = _open_machine(
            consensus, blob, name, wanted or P.full_schema(), config, create, clock, owned, remote
        )
        stored = P.schema_from_bytes(machine.state().schema)
        if wanted is not None and not wanted.equals(stored):
            raise SchemaMismatch(
                f"shard {name!r} has schema {stored} which differs from the requested {wanted}"
            )
        counters = ShardStats()
        maintenance = (
            LocalMaintenance(machine, blob, stored, counters)
            if isinstance(machine, LocalMachine)
            else machine
        )
        return Shard(name, machine, maintenance, blob, stored, config, clock, owned, counters)
    except BaseException:
        for resource in reversed(owned):
            resource.close()
        raise


def _open_machine(
    consensus: str | Consensus,
    blob: Blob,
    name: str,
    schema: pa.Schema,
    config: ShardConfig,
    create: bool,
    clock: Callable[[], int],
    owned: list,
    remote: RemoteOpener | None,
) -> ShardMachine:
    """The one place a consensus argument turns into a shard machine."""
    if isinstance(consensus, str):
        if urlsplit(consensus).scheme.lower() in REMOTE_SCHEMES:
            if remote is None:
                check_address(consensus, for_bind=False)  # a malformed one is named as such
                raise ValueError(
                    f"consensus {consensus!r} names a consensus server: open the shard with "
                    "shardsink.open_shard, which can reach one"
                )
            machine = remote(consensus, name, P.schema_to_bytes(schema), config, create)
            owned.append(machine)
            return machine
        consensus = open_consensus(consensus)
        owned.append(consensus)
    machine = LocalMachine.open(
        consensus,
        blob,
        name,
        schema=P.schema_to_bytes(schema),
        config=config,
        create=create,
        clock=clock,
    )
    owned.append(machine)
    return machine


class Shard:
    """A handle on one shard. Thread-safe for state access; writers and
    readers are meant for one thread each. ``close()`` closes its readers and
    writers, then what it opened; it is idempotent."""

    def __init__(
        self,
        name: str,
        machine: ShardMachine,
        maintenance: Maintenance,
        blob: Blob,
        schema: pa.Schema,
        config: ShardConfig,
        clock: Callable[[], int],
        owned: list,
        counters: ShardStats,
    ) -> None:
        self.name = name
        self.schema = schema
        self.config = config
        self.machine = machine
        self.maintenance = maintenance
        self.blob = blob
        self.clock = clock
        self._owned = owned
        self._handles: list[Writer | Reader] = []
        self._counters = counters
        self._closed = False

    # --- state ------------------------------------------------------------------

    def state(self, refresh: bool = True) -> ShardState:
        """The latest state (re-read from consensus unless ``refresh`` is false)."""
        return self.machine.state(refresh=refresh)

    @property
    def upper(self) -> int:
        return self.state().upper

    @property
    def since(self) -> int:
        return self.state().since

    @property
    def seqno(self) -> int:
        return self.state().seqno

    def stats(self) -> ShardStats:
        """What this handle counted (see :class:`ShardStats`)."""
        machine = msgspec.structs.asdict(self.machine.stats())
        return msgspec.structs.replace(self._counters, **machine)

    def inspect(self) -> dict:
        """A summary of the latest state: frontiers, batch and part counts,
        inline and blob bytes, readers and writers."""
        state = self.state()
        all_parts = [p for b in state.batches.values() for p in b.parts]
        now = self.clock()
        return {
            "shard": self.name,
            "seqno": state.seqno,
            "upper": state.upper,
            "since": state.since,
            "batches": len(state.batches),
            "parts": len(all_parts),
            "inline_parts": sum(isinstance(p, InlinePart) for p in all_parts),
            "blob_parts": sum(isinstance(p, BlobPart) for p in all_parts),
            "rows": sum(b.rows for b in state.batches.values()),
            "inline_bytes": state.inline_bytes,
            "blob_bytes": sum(p.encoded_bytes for p in all_parts if isinstance(p, BlobPart)),
            "rollups": sorted(state.rollups),
            "retired_blobs": sum(len(v) for v in state.retired.values()),
            "readers": {
                rid: {
                    "seqno_hold": r.seqno_hold,
                    "heartbeat_age_ms": now - r.heartbeat_ms,
                    "lease_ms": r.lease_ms,
                    "expired": r.expired(now),
                }
                for rid, r in sorted(state.readers.items())
            },
            "writers": {
                wid: {"upper": w.upper, "token": w.token, "heartbeat_age_ms": now - w.heartbeat_ms}
                for wid, w in sorted(state.writers.items())
            },
        }

    def history(self, limit: int = 20) -> list[dict]:
        """What the last ``limit`` retained versions that changed the data
        did, oldest first (see :func:`~.read.history`): new upper and since,
        batches added and replaced, the appending writer and its wall time."""
        if limit < 1:
            raise ValueError(f"history: limit must be >= 1, got {limit}")
        return read.history(self.machine, limit)

    # --- handles ------------------------------------------------------------------

    def writer(self, name: str | None = None) -> Writer:
        """A registered writer called ``name`` (default: a fresh one); its id,
        ``writer_id``, is the shard's (:class:`~.commands.RegisterWriter`)."""
        writer = Writer(self, name or f"w-{uuid.uuid4().hex}")
        self._handles.append(writer)
        return writer

    def reader(self, reader_id: str | None = None, *, lease_ms: int | None = None) -> Reader:
        """A registered, leased reader; its lease lasts ``lease_ms`` (default
        ``config.reader_lease_ms``) past each heartbeat."""
        reader = Reader(self, reader_id or f"r-{uuid.uuid4().hex}", lease_ms)
        self._handles.append(reader)
        return reader

    def snapshot(self, as_of: int | None = None) -> pa.Table:
        """``Reader.snapshot`` through a short-lived reader."""
        with self.reader() as reader:
            return reader.snapshot(as_of)

    def batches(
        self,
        as_of: int | None = None,
        columns: Sequence[str] | None = None,
        *,
        wait: float = 0.0,
        max_rows: int = BATCH_ROWS,
        window_rows: int = read.WINDOW_ROWS,
    ) -> pa.RecordBatchReader:
        """``Reader.batches`` through a reader of its own, whose lease the
        stream holds until it is exhausted or dropped (or the shard closed)."""
        return self.reader()._batches(
            as_of, columns, wait, max_rows, window_rows=window_rows, release=True
        )

    def verify(self) -> VerifyReport:
        """Check every part and rollup of the latest state against the blob
        store, under a reader lease (so GC keeps what is checked): see
        :func:`~.verify.verify`."""
        with self.reader() as reader:
            return verify(reader.lease(), self.blob)

    # --- maintenance ----------------------------------------------------------------

    def advance_since(self, since: int) -> None:
        """Allow times below ``since`` to be merged forward; it must stay below
        the upper (else ``ValueError``). Lowering it is a no-op."""
        result = self.machine.run(AdvanceSince(since))
        if isinstance(result, Rejected):
            raise ValueError(f"shard {self.name!r}: {result.reason}")

    def compact(self) -> CompactionReport:
        """Merge runs of adjacent small batches (see ``compaction.compact``),
        where the shard's state is owned (:attr:`maintenance`: this process,
        or the consensus server)."""
        return self.maintenance.compact()

    def collect_garbage(self) -> GcReport:
        """Expire readers, delete unreachable blobs, truncate consensus (see
        ``gc.collect_garbage``), where the state is owned."""
        return self.maintenance.collect_garbage()

    def sweep_leaked_blobs(self, grace_ms: int | None = None) -> list[str]:
        """Delete the unreferenced blobs of writers gone from state, and
        temporary files of writers killed mid-``set``, older than
        ``grace_ms`` (default ``config.leaked_blob_grace_ms``; never shorter
        than the writer lease: ``ValueError``), where the state is owned;
        return their keys, then the temporary files' names (see
        ``gc.sweep_leaked_blobs``)."""
        return self.maintenance.sweep_leaked_blobs(grace_ms)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for handle in reversed(self._handles):
            try:
                handle.close()
            except (StorageError, PersistError) as exc:
                log.warning("shard %r: closing %r failed: %s", self.name, handle, exc)
        for resource in reversed(self._owned):
            resource.close()

    def __enter__(self) -> Shard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Shard({self.name!r})"


class Writer:
    """Builds batches and compare-and-appends them, as the writer registered
    under ``name``; ``writer_id`` is the id the shard gave it (its parts'
    keys carry it). Once expired (its lease ran out) it stays expired: its
    calls raise :class:`~.errors.WriterExpired`, and a new writer takes
    over. ``close()`` forgets the writer in state (idempotent)."""

    def __init__(self, shard: Shard, name: str) -> None:
        self.shard = shard
        self.name = name
        self._pending: tuple[str, tuple[str, ...], int, int] | None = None
        self._closed = False
        self.writer_id = register_writer(shard.machine, name)

    def heartbeat(self) -> None:
        """Tell the shard this writer is alive, so it is not expired;
        :class:`~.errors.WriterExpired` if it already was."""
        result = self.shard.machine.run(HeartbeatWriter(self.writer_id))
        if isinstance(result, WriterGone):
            raise self._expired()

    def batch(self, updates: pa.Table, lower: int, upper: int) -> Batch:
        """Write ``updates`` (columns key, val, ts, diff) as a batch ``[lower,
        upper)``: consolidated, split into parts near the blob target size,
        small parts inline. ``ValueError`` if ``lower < upper`` does not hold,
        a column is missing or does not cast, or a row's ts is outside
        ``[lower, upper)``."""
        check_interval(lower, upper)
        shard = self.shard
        table = P.conform(updates, shard.schema)
        check_ts(table, shard.name, lower, upper)
        return build_batch(
            shard.blob,
            shard.name,
            P.consolidate(table),
            lower,
            upper,
            writer=self.writer_id,
            inline_max_bytes=shard.machine.state().inline_max_bytes,
            target_bytes=shard.config.blob_target_bytes,
            stats=shard._counters,
        )

    def compare_and_append(
        self,
        batches: list[Batch],
        expected_upper: int,
        new_upper: int,
        *,
        token: str | None = None,
    ) -> int:
        """Append ``batches`` (each ``[expected_upper, new_upper)``; none for an
        empty interval) iff the shard's upper is ``expected_upper``; return the
        new upper.

        The call carries an idempotency ``token`` (fresh by default). If it
        raises (a storage error, :class:`~.errors.Contended`), the outcome may
        be unknown: calling again with the same batches and uppers reuses the
        token, so it succeeds exactly once and never appends twice.

        Errors: :class:`UpperMismatch` (with the actual upper); ``ValueError``
        for batches that do not match the interval; storage errors.
        """
        batches = list(batches)
        for batch in batches:
            if (batch.lower, batch.upper) != (expected_upper, new_upper):
                raise ValueError(
                    f"batch {batch.id!r} covers [{batch.lower}, {batch.upper}), not the "
                    f"appended interval [{expected_upper}, {new_upper})"
                )
        signature = (tuple(b.id for b in batches), expected_upper, new_upper)
        if token is None:
            token = self._pending[0] if self._pending and self._pending[1:] == signature else None
            token = token or uuid.uuid4().hex
        shard = self.shard
        shard._counters.append_calls += 1
        command = CompareAndAppend(self.writer_id, token, tuple(batches), expected_upper, new_upper)
        try:
            result = shard.machine.run(command)
            if isinstance(result, InlineCapExceeded):
                flushed = tuple(
                    flush_inline(
                        shard.blob, shard.name, self.writer_id, b, shard.schema, shard._counters
                    )
                    for b in batches
                )
                result = shard.machine.run(msgspec.structs.replace(command, batches=flushed))
                batches = list(flushed)
        except Exception:
            # the outcome may be unknown: a retry of this same call reuses the token
            self._pending = (token, *signature)
            raise
        self._pending = None
        return self._outcome(result, batches, expected_upper)

    def _outcome(self, result: Result, batches: list[Batch], expected_upper: int) -> int:
        shard = self.shard
        if isinstance(result, Appended | AlreadyAppended):
            counters = shard._counters
            counters.appends += 1
            for batch in batches:
                counters.rows += batch.rows
                for part in batch.parts:
                    if isinstance(part, InlinePart):
                        counters.inline_parts += 1
                        counters.inline_bytes += len(part.data)
                    else:
                        counters.data_parts += 1
            return result.upper
        if isinstance(result, WrongUpper):
            raise UpperMismatch(shard.name, expected_upper, result.actual)
        if isinstance(result, WriterGone):
            raise self._expired()
        if isinstance(result, PartsMissing):
            raise PartsNotFound(shard.name, result.keys, result.reason)
        if isinstance(result, Rejected):
            raise ValueError(f"shard {shard.name!r}: compare_and_append rejected: {result.reason}")
        raise ValueError(f"shard {shard.name!r}: compare_and_append answered {result!r}")

    def compare_and_append_table(
        self, updates: pa.Table, expected_upper: int, new_upper: int
    ) -> int:
        """Build one batch of ``updates`` and compare-and-append it; on
        :class:`UpperMismatch` its blobs are deleted before the error is raised.

        Each call builds a new batch, hence a new token: to retry an append
        whose outcome is unknown exactly once, use :meth:`batch` and retry
        :meth:`compare_and_append` with the same batch."""
        batch = self.batch(updates, expected_upper, new_upper)
        try:
            return self.compare_and_append([batch], expected_upper, new_upper)
        except (UpperMismatch, WriterExpired, PartsNotFound):
            self.discard([batch], tried=True)
            raise

    def discard(self, batches: list[Batch], *, tried: bool = False) -> None:
        """Delete the blobs of ``batches``, which were never appended; with
        ``tried`` (an append of them was tried, and a try whose answer was
        lost may have committed them), only those the shard's current state
        does not reference (its state unreadable: none, the sweep takes them
        once this writer is gone). Best effort, as
        :func:`~.batches.delete_unreferenced`."""
        keys = [k for b in batches for k in b.blob_keys()]
        if tried and keys:
            try:
                referenced = self.shard.state(refresh=True).referenced_keys()
            except (StorageError, PersistError) as exc:
                log.warning("%r: leaving %d blobs to the sweep: %s", self.shard, len(keys), exc)
                return
            keys = [k for k in keys if k not in referenced]
        delete_unreferenced(self.shard.blob, keys)

    def _expired(self) -> WriterExpired:
        return WriterExpired(
            f"shard {self.shard.name!r}: writer {self.writer_id} expired (not seen for its "
            "lease); nothing was appended: write the batch again with a new writer"
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.shard.machine.run(ExpireWriter(self.writer_id))

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Writer({self.writer_id!r} on {self.shard.name!r})"


class Reader:
    """A leased reader. Every read first moves the lease to the newest version
    and then selects batches from exactly that version, so GC keeps every
    blob it selects. ``close()`` releases the lease (idempotent)."""

    def __init__(self, shard: Shard, reader_id: str, lease_ms: int | None) -> None:
        self.shard = shard
        self.reader_id = reader_id
        self.lease_ms = shard.config.reader_lease_ms if lease_ms is None else lease_ms
        if self.lease_ms < 1:
            raise ValueError(f"reader lease must be >= 1 ms, got {self.lease_ms}")
        self._closed = False
        self._register()

    def _register(self) -> ShardState:
        result = self.shard.machine.run(RegisterReader(self.reader_id, self.lease_ms))
        return _leased(self.shard, result)

    def lease(self) -> ShardState:
        """Heartbeat and move this reader's hold to the newest version; return
        that version. An expired reader registers again: safe, because what it
        reads is selected after the lease."""
        self._check_open()
        result = self.shard.machine.run(LeaseSeqno(self.reader_id))
        return (
            self._register() if isinstance(result, ReaderExpired) else _leased(self.shard, result)
        )

    def heartbeat(self) -> None:
        """Renew the lease without moving the hold."""
        self._check_open()
        if isinstance(self.shard.machine.run(HeartbeatReader(self.reader_id)), ReaderExpired):
            self._register()

    def snapshot(self, as_of: int | None = None, *, wait: float = 0.0) -> pa.Table:
        """The consolidated collection as of ``as_of``, all of it in memory:
        :meth:`batches` read to the end."""
        return self.batches(as_of, wait=wait).read_all()

    def batches(
        self,
        as_of: int | None = None,
        columns: Sequence[str] | None = None,
        *,
        wait: float = 0.0,
        max_rows: int = BATCH_ROWS,
        window_rows: int = read.WINDOW_ROWS,
    ) -> pa.RecordBatchReader:
        """Stream the consolidated collection as of ``as_of`` (default: upper -
        1): ``columns`` (default key, val, ts, diff) of every ``(key, val)``
        whose diffs at ``ts <= as_of`` do not sum to zero, with ts = ``as_of``
        and diff = the sum, sorted by key then val, in record batches of at
        most ``max_rows`` rows. Empty if nothing was ever written and
        ``as_of`` is ``None``.

        Memory is bounded by the parts overlapping one key range
        (:func:`~.read.windows`; a window takes at most ``window_rows`` rows
        of each part it spans), not by the shard. The stream holds its own
        lease (heartbeated while it is read), taken before it selects parts
        and released when it is exhausted, or dropped, or its shard closed; a part gone missing
        mid-stream (an expired lease) resumes after the last key sent from
        refreshed state.

        Errors, raised here: ``ValueError`` for an unknown column;
        :class:`NotReadable` if ``as_of`` is below ``since``, or not below the
        upper after waiting up to ``wait`` seconds. While reading:
        :class:`PartMissing` if a part stays missing through ``PART_RETRIES``
        refreshes, :class:`NotReadable` if ``since`` passed ``as_of`` meanwhile."""
        return self._batches(as_of, columns, wait, max_rows, window_rows=window_rows, release=False)

    def _batches(
        self,
        as_of: int | None,
        columns: Sequence[str] | None,
        wait: float,
        max_rows: int,
        *,
        window_rows: int,
        release: bool,
    ) -> pa.RecordBatchReader:
        """:meth:`batches`; with ``release`` the stream closes this reader
        when it is exhausted or dropped (and an error raised here closes it)."""
        try:
            self._check_open()
            names = read.output_columns(self.shard.schema, columns)
            for name, rows in (("max_rows", max_rows), ("window_rows", window_rows)):
                if rows < 1:
                    raise ValueError(f"{name} must be >= 1, got {rows}")
            state, as_of = self._readable(as_of, wait)
        except BaseException:
            if release:
                self.close()
            raise
        schema = pa.schema([self.shard.schema.field(n) for n in names])
        if as_of is None:
            if release:
                self.close()
            return pa.RecordBatchReader.from_batches(schema, iter(()))
        batches = self._stream(state, as_of, names, max_rows, window_rows, release)
        if release:
            # a stream dropped before its first batch never runs its generator's finally
            weakref.finalize(batches, self.close)
        return pa.RecordBatchReader.from_batches(schema, batches)

    def to_duckdb(self, connection=None, as_of: int | None = None, columns=None):
        """The snapshot as a DuckDB relation on ``connection`` (default: a new
        in-memory one) that scans :meth:`batches` as DuckDB reads it (needs
        the ``read`` extra)."""
        import duckdb

        connection = connection or duckdb.connect()
        return connection.from_arrow(self.batches(as_of, columns))

    def to_polars(self, as_of: int | None = None, columns=None):
        """The snapshot as a Polars DataFrame built from :meth:`batches`'
        Arrow buffers (needs the ``read`` extra)."""
        import polars

        return polars.from_arrow(self.batches(as_of, columns).read_all())

    def manifest(self, as_of: int | None = None) -> dict:
        """The live parts and inline updates a snapshot as of ``as_of`` reads,
        from the version this reader leases (see :func:`~.read.manifest`);
        :class:`NotReadable` as for :meth:`batches`."""
        self._check_open()
        state, as_of = self._readable(as_of, 0.0)
        return read.manifest(state, as_of, self.shard.schema)

    def _readable(self, as_of: int | None, wait: float) -> tuple[ShardState, int | None]:
        """Lease, then the leased state and the as-of to read (``None``: the
        shard was never written and none was asked); :class:`NotReadable` as
        for :meth:`batches`."""
        state = self.lease()
        if as_of is None:
            if state.upper == 0:
                return state, None
            as_of = state.upper - 1
        if as_of >= state.upper:
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    self.shard.machine.wait_for_upper_past(as_of, wait)
                state = self.lease()
            if as_of >= state.upper:
                raise NotReadable(
                    f"shard {self.shard.name!r}: as_of {as_of} is not below the upper "
                    f"{state.upper} (not yet written)"
                )
        self._check_since(state, as_of)
        return state, as_of

    def _check_since(self, state: ShardState, as_of: int) -> None:
        if as_of < state.since:
            raise NotReadable(
                f"shard {self.shard.name!r}: as_of {as_of} is below the since "
                f"{state.since} (merged forward)"
            )

    def _stream(
        self,
        state: ShardState,
        as_of: int,
        names: list[str],
        max_rows: int,
        window_rows: int,
        release: bool,
    ) -> Iterator[pa.RecordBatch]:
        """The record batches of :meth:`batches`; with ``release``, closes
        this reader when exhausted, closed or failed."""
        shard = self.shard
        after = None
        beat = time.monotonic()
        try:
            for attempt in range(PART_RETRIES + 1):
                if attempt:
                    shard._counters.part_refetches += 1
                    state = self.lease()
                    self._check_since(state, as_of)
                faults.point("reader.before_fetch")
                parts = [p for b in state.ordered_batches() if b.lower <= as_of for p in b.parts]
                load = functools.partial(
                    read.part_chunks,
                    shard.blob,
                    shard.name,
                    schema=shard.schema,
                    rows=read.CHUNK_ROWS,
                )
                try:
                    for table, cut in read.windows(
                        parts, load, as_of, shard.schema, after, window_rows
                    ):
                        after = cut
                        if time.monotonic() - beat > self.lease_ms / 3000.0:
                            self.heartbeat()
                            beat = time.monotonic()
                        yield from table.select(names).to_batches(max_chunksize=max_rows)
                    return
                except read.Missing as missing:
                    key = missing.key
            raise PartMissing(shard.name, key, PART_RETRIES + 1)
        finally:
            if release:
                self.close()

    def listen(
        self,
        since: int | None = None,
        *,
        until: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[ListenEvent]:
        """Each appended interval from ``since`` on (default: the current
        upper), in order, as :class:`ListenEvent` s that tile the times
        (intervals merged by compaction come as one event). Stops once an
        event reaches ``until``; waits for new appends otherwise,
        heartbeating, and raises ``TimeoutError`` after ``timeout`` seconds
        without one.

        Errors: :class:`NotReadable` if the frontier is at or below a
        non-zero ``since`` (times there may have been merged forward);
        :class:`PartMissing` as for :meth:`snapshot`."""
        schema = self.shard.schema
        frontier = self.shard.upper if since is None else since
        while until is None or frontier < until:
            state = self.lease()
            if state.upper <= frontier:
                self._wait_past(frontier, timeout)
                continue

            def select(state: ShardState, frontier: int = frontier) -> list[Batch]:
                if state.since > 0 and frontier <= state.since:
                    raise NotReadable(
                        f"shard {self.shard.name!r}: listen frontier {frontier} is not above "
                        f"the since {state.since} (merged forward)"
                    )
                return [b for b in state.ordered_batches() if b.upper > frontier]

            state, tables = self._read(state, select)
            data = P.in_times(P.concat(tables, schema), frontier, state.upper)
            cuts = {frontier, state.upper}
            for batch in state.ordered_batches():
                cuts.update(t for t in (batch.lower, batch.upper) if frontier < t < state.upper)
            bounds = sorted(cuts)
            for lower, upper in itertools.pairwise(bounds):
                yield ListenEvent(lower, upper, P.consolidate(P.in_times(data, lower, upper)))
            frontier = state.upper

    def _wait_past(self, frontier: int, timeout: float | None) -> None:
        """Wait for the upper to pass ``frontier``, heartbeating every third of
        the lease; ``TimeoutError`` after ``timeout`` seconds."""
        chunk = self.lease_ms / 3000.0
        remaining = timeout
        while True:
            step = chunk if remaining is None else min(chunk, remaining)
            try:
                self.shard.machine.wait_for_upper_past(frontier, step)
                return
            except TimeoutError:
                if remaining is not None:
                    remaining -= step
                    if remaining <= 0:
                        raise TimeoutError(
                            f"shard {self.shard.name!r}: upper did not pass {frontier} "
                            f"within {timeout} s"
                        ) from None
                self.heartbeat()

    def _read(
        self, state: ShardState, select: Callable[[ShardState], list[Batch]]
    ) -> tuple[ShardState, list[pa.Table]]:
        """Fetch the parts of the batches ``select`` picks from the leased
        ``state``; if a part's blob is missing, lease again and re-select, at
        most ``PART_RETRIES`` times, then raise :class:`PartMissing`."""
        shard = self.shard
        cache: dict[str, pa.Table] = {}
        for attempt in range(PART_RETRIES + 1):
            if attempt:
                shard._counters.part_refetches += 1
                state = self.lease()
            selected = select(state)
            faults.point("reader.before_fetch")
            fetched = self._fetch(selected, cache)
            if not isinstance(fetched, str):
                return state, fetched
        raise PartMissing(shard.name, fetched, PART_RETRIES + 1)

    def _fetch(self, batches: list[Batch], cache: dict[str, pa.Table]) -> list[pa.Table] | str:
        """The tables of ``batches``' parts, or the key of a missing one.
        ``cache`` keeps blob parts across attempts (blob keys are immutable)."""
        shard = self.shard
        tables = []
        for part in (p for b in batches for p in b.parts):
            table = cache.get(part.key) if isinstance(part, BlobPart) else None
            if table is None:
                table = load_part(shard.blob, shard.name, part, shard.schema)
                if table is None:
                    return part.key
                if isinstance(part, BlobPart):
                    cache[part.key] = table
            tables.append(table)
        return tables

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"reader {self.reader_id!r} of shard {self.shard.name!r} is closed")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.shard.machine.run(ExpireReader(self.reader_id))

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Reader({self.reader_id!r} on {self.shard.name!r})"


def _leased(shard: Shard, result: Result) -> ShardState:
    if isinstance(result, Leased):
        return result.state
    raise ValueError(f"shard {shard.name!r}: reader lease answered {result!r}")
