"""The shard handle: :meth:`Shard.open`, the shard's state, its writers and
readers, and its maintenance.

A :class:`Shard` pairs a :class:`~.machine.ShardMachine` (the shard's state)
with the blob store holding its data parts. Writers (:mod:`.writer`) build
batches and compare-and-append them; readers (:mod:`.reader`) take a seqno
lease before selecting what to read, so garbage collection cannot delete what
they are about to fetch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import msgspec
import pyarrow as pa

from .. import faults
from .._address import REMOTE_SCHEMES, check_address
from ..options import did_you_mean
from ..storage import Blob, Consensus, StorageError
from . import parts as P
from .commands import AdvanceSince, Rejected
from .compaction import CompactionReport
from .config import ShardConfig
from .errors import PersistError, SchemaMismatch, ShardNotFound
from .gc import GcReport
from .machine import LocalMachine, ShardMachine, wall_clock_ms
from .maintenance import LocalMaintenance, Maintenance
from .manifest import history
from .reader import BATCH_ROWS, Reader
from .state import BlobPart, InlinePart, ShardState, check_shard_name
from .stats import ShardStats
from .verify import VerifyReport, verify
from .windows import WINDOW_ROWS
from .writer import Writer

log = logging.getLogger(__name__)

#: Opens the shard machine of a consensus server's address (``tcp://``,
#: ``ipc://``): ``(address, shard, schema bytes, config, create)``; the
#: machine is also the shard's :class:`~.maintenance.Maintenance` (the server
#: maintains the shards it holds). The server package has one;
#: :func:`shardsink.connect.open_shard` passes it here.
RemoteOpener = Callable[[str, str, bytes, ShardConfig, bool], ShardMachine]


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
        #: Set by a caller that owns the shard's blobs alone (it holds the
        #: data dir's lock: no other process collects garbage or compacts):
        #: then readers read without a lease (:class:`~.reader.Reader`), so
        #: reads change no state.
        self.sole_owner = False

    @classmethod
    def open(
        cls,
        name: str = "default",
        *,
        blob: str | Blob,
        consensus: str | Consensus,
        schema: pa.Schema | None = None,
        config: ShardConfig | None = None,
        create: bool | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        remote: RemoteOpener | None = None,
    ) -> Shard:
        """Open the shard ``name``; create it if it does not exist and
        ``create`` is true, or is ``None`` (the default) and ``schema`` is
        given: opening a shard by name alone never creates one, so a
        misspelt name fails (with the shards there are) instead of making
        an empty shard.

        ``blob`` and ``consensus`` are URIs (``open_blob``/``open_consensus``
        forms; the handle closes what it opened) or open stores (left open).
        A ``consensus`` of ``tcp://HOST:PORT`` or ``ipc:///path`` names a running
        consensus server (``shardsink consensus serve``), which then applies every
        state change (and whose clock then times leases); ``remote`` opens it
        (``ValueError`` without one: open such a shard with
        :func:`shardsink.open_shard`).
        ``schema`` is the ``key``/``val`` schema (``ts``/``diff`` are added) or the
        full one; ``None`` means the existing shard's schema, or key int64 / val
        string for a new shard made with ``create=True``. ``clock`` gives
        milliseconds (leases, sweeps).

        Errors: ``ValueError`` for a bad name, URI or schema;
        :class:`SchemaMismatch` if the shard exists with another schema;
        :class:`~.errors.ShardNotFound` (naming the shards there are) if it
        does not exist and is not to be created;
        storage errors if a store cannot be reached.
        """
        check_shard_name(name)
        create = schema is not None if create is None else create
        config = config or ShardConfig()
        wanted = None if schema is None else P.full_schema(schema)
        owned: list = []
        try:
            if isinstance(blob, str):
                blob = faults.open_blob(blob)
                owned.append(blob)
            machine = _open_machine(
                consensus,
                blob,
                name,
                wanted or P.full_schema(),
                config,
                create,
                clock,
                owned,
                remote,
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
            return cls(name, machine, maintenance, blob, stored, config, clock, owned, counters)
        except BaseException:
            for resource in reversed(owned):
                resource.close()
            raise

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
        did, oldest first (see :func:`~.manifest.history`): new upper and since,
        batches added and replaced, the appending writer and its wall time."""
        if limit < 1:
            raise ValueError(f"history: limit must be >= 1, got {limit}")
        return history(self.machine, limit)

    # --- handles ------------------------------------------------------------------

    def writer(self, name: str | None = None) -> Writer:
        """A registered writer called ``name`` (default: a fresh one); its id,
        ``writer_id``, is the shard's (:class:`~.commands.RegisterWriter`)."""
        writer = Writer(self, name or f"w-{uuid.uuid4().hex}")
        self._handles.append(writer)
        return writer

    def reader(self, reader_id: str | None = None, *, lease_ms: int | None = None) -> Reader:
        """A registered, leased reader; its lease lasts ``lease_ms`` (default
        ``config.reader_lease_ms``) past each heartbeat. Of a
        :attr:`sole_owner`'s handle: a reader without a lease, which changes
        no state."""
        reader = Reader(
            self, reader_id or f"r-{uuid.uuid4().hex}", lease_ms, leased=not self.sole_owner
        )
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
        window_rows: int = WINDOW_ROWS,
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
        consensus = faults.open_consensus(consensus)
        owned.append(consensus)
    try:
        machine = LocalMachine.open(
            consensus,
            blob,
            name,
            schema=P.schema_to_bytes(schema),
            config=config,
            create=create,
            clock=clock,
        )
    except ShardNotFound as exc:
        raise ShardNotFound(f"{exc}{existing_shards(consensus, name)}") from None
    owned.append(machine)
    return machine


#: Shards an error lists by name at most.
SHOWN_SHARDS = 10


def existing_shards(consensus: Consensus, name: str) -> str:
    """For a :class:`ShardNotFound` of ``name``: ``; it holds 'a' and 'b';
    did you mean 'a'?``, the shards ``consensus`` holds (at most
    :data:`SHOWN_SHARDS` named) and those nearest ``name``; ``""`` if the
    store cannot list them."""
    try:
        names = sorted(consensus.list_shards())
    except StorageError:
        return ""
    if not names:
        return "; it holds no shard yet (a writer creates one: shardsink up, or open_shard)"
    shown = ", ".join(map(repr, names[:SHOWN_SHARDS]))
    if len(names) > SHOWN_SHARDS:
        shown += f" and {len(names) - SHOWN_SHARDS} more (shardsink shard list)"
    return f"; it holds {shown}" + did_you_mean(name, names, quote=True)
