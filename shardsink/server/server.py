"""The consensus server: the one process that changes shard state.

A single-threaded ZeroMQ ROUTER loop applies requests in arrival order, so the
commands of one shard are serialized and writers never race each other's
compare-and-set. Each shard's state lives in a
:class:`~shardsink.persist.machine.LocalMachine` whose cache is the head (this
server is the only writer), so reading state costs no store round trip; a
command's new version is stored durably before its reply is sent.

Commands are group-committed (:mod:`.group_commit`): the loop queues them
per shard and, after a batch window that adapts to the store's commit
latency, applies the oldest of each shard to its state and stores all their
versions with one ``compare_and_set_many`` (one transaction, one fsync on
SQLite), at most ``batch_max`` shards a batch and one command per shard.
Each command keeps its own answer: a version that does not commit sends
only its machine back to its own retrying run.

Maintenance (expiry, retention, GC, the leaked-blob sweep, the spine's
merges, and the jobs clients ask for) runs beside the loop on threads of
its own (:mod:`.maintenance`): no blob delete or merge blocks the request
loop, and a writer whose process died is gone at most 1.1 writer leases
after it was last seen.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

import msgspec
import zmq

from .. import faults
from .._curve import ServerKeys
from ..persist import (
    CLIENT_COMMANDS,
    COMPACT_INTERVAL_S,
    COMPACT_SLACK,
    SERVED_FIELDS,
    Command,
    ExpireWriter,
    LocalMachine,
    LocalTransactions,
    MachineStats,
    PersistError,
    Prepared,
    Result,
    ShardConfig,
    check_grace,
    check_served,
    wall_clock_ms,
)
from ..storage import Blob, CasRequest, Consensus, StorageError
from .config import BATCH_MAX, BATCH_WINDOW_MAX_S
from .group_commit import OWN, BatchWindow, CommandQueue, OwnCommands, Queued
from .loaded import LoadedShard
from .maintenance import ServerMaintenance
from .rpc import RpcServer
from .wire import (
    ErrorReply,
    FetchState,
    GetStats,
    Maintain,
    OpenedReply,
    OpenShard,
    Ping,
    Pong,
    RunCommand,
    RunReply,
    RunTransaction,
    ScanVersions,
    ServerReply,
    ServerRequest,
    ShardCounters,
    StateReply,
    StatsReply,
    TransactionReply,
    Version,
    VersionsReply,
    WaitForUpper,
    decode_request,
    encode,
    error_kind,
)

log = logging.getLogger(__name__)

#: Longest a long poll is parked; clients re-poll, so this only bounds how long
#: a vanished client's entry lingers.
MAX_PARK_MS = 30_000
#: Requests larger than this are dropped by ZeroMQ before we see them: a state
#: command is kilobytes, so anything near this is garbage or an attack.
MAX_REQUEST_BYTES = 64 << 20
#: Most versions one :class:`ScanVersions` answer carries (diffs are kilobytes).
MAX_SCAN_VERSIONS = 1000


class _Parked(msgspec.Struct):
    peer: bytes
    request_id: bytes
    shard: str
    past: int
    deadline: float


class ConsensusServer:
    """Serve shard state over ZeroMQ at ``bind``, storing versions in ``store``
    and rollups in ``blob`` (both closed by :meth:`close`).

    ``gc_interval_s`` / ``sweep_interval_s`` schedule GC and the leaked-blob
    sweep per loaded shard (``0`` disables each). Every ``compact_interval_s``
    (``0``: never) the spine's merges are looked at and, once they remove
    ``compact_slack`` batches, a pass starts in one of the spine's lanes
    (:mod:`.maintenance`).
    ``config`` holds the settings every shard runs with here, whoever opened
    it first and after a restart alike (its
    :data:`~shardsink.persist.config.SERVED_FIELDS`: rollup threshold,
    leaked-blob grace, max attempts); a client opening a shard with others
    gets a ``bad_request`` error naming them. Its ``writer_lease_ms`` is the
    lease writers are expired by, told to every client that opens a shard;
    its ``retain`` (``0``: off) is how far maintenance keeps ``since`` behind
    the upper (:func:`~shardsink.persist.transitions.retention_since`).
    :attr:`on_command`, if set, is called in the request loop after every
    command a shard ran, with the shard's name, the command, its result and
    the seconds it took (stored durably included); it must not raise (the
    metrics count with it).
    A ``tcp://`` ``bind`` needs CURVE ``keys``: it answers only the clients
    they accept. ``check_parts``: see
    :class:`~shardsink.persist.machine.LocalMachine` (off only to measure).
    Use :meth:`serve` to run the loop until ``stop`` is set, :meth:`close`
    (idempotent) to release everything.
    """

    def __init__(
        self,
        store: Consensus,
        blob: Blob,
        bind: str,
        *,
        gc_interval_s: float = 60.0,
        compact_interval_s: float = COMPACT_INTERVAL_S,
        compact_slack: int = COMPACT_SLACK,
        sweep_interval_s: float = 600.0,
        config: ShardConfig | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        keys: ServerKeys | None = None,
        check_parts: bool = True,
        batch_max: int = BATCH_MAX,
        batch_window_max_s: float = BATCH_WINDOW_MAX_S,
    ) -> None:
        config = config or ShardConfig()
        check_grace(config.leaked_blob_grace_ms, config.writer_lease_ms)
        self._store = store
        self._blob = blob
        self._rpc = RpcServer(bind, keys=keys)
        self._rpc.socket.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        self.address = self._rpc.address
        self.config = config
        self._clock = clock
        self._check_parts = check_parts
        self._shards: dict[str, LoadedShard] = {}
        self._queue = CommandQueue()
        self._own = OwnCommands()
        self._maintenance = ServerMaintenance(
            blob, config, clock, self._own,
            gc_interval_s=gc_interval_s, sweep_interval_s=sweep_interval_s,
            compact_interval_s=compact_interval_s, compact_slack=compact_slack,
        )  # fmt: skip
        if batch_max < 1:
            raise ValueError(f"batch_max must be at least 1, got {batch_max}")
        self._batch_max = batch_max
        self.window = BatchWindow(batch_window_max_s)
        self.batches = 0
        self._parked: list[_Parked] = []
        self.requests = 0
        self.errors = 0
        self.on_command: Callable[[str, Command, Result, float], None] | None = None
        self._closed = False

    # --- the loop ---------------------------------------------------------------

    def serve(self, stop: threading.Event, poll_ms: int = 50) -> None:
        """Answer requests until ``stop`` is set: shard commands are queued
        and stored a batch at a time (:meth:`_commit_batch`), after the
        batch window (:class:`~.group_commit.BatchWindow`) gathered more."""
        while not stop.is_set():
            for item in self._own.take():
                self._queue.put(item)
            if not self._receive(0 if len(self._queue) else poll_ms):
                self.window.idle()
            if len(self._queue):
                if self.window.seconds > 0 and len(self._queue) < self._batch_max:
                    time.sleep(self.window.seconds)
                    self._receive(0)
                self._commit_batch()
            self._answer_parked(time.monotonic())
            self._answer_jobs()
            self._maintenance.schedule(iter(self._shards.values()))

    def _receive(self, timeout_ms: int) -> int:
        """Answer or queue what arrives within ``timeout_ms``; how many came."""
        received = self._rpc.receive(timeout_ms)
        for peer, request_id, payload in received:
            self.requests += 1
            reply = self._handle(peer, request_id, payload)
            if reply is not None:
                self._rpc.reply(peer, request_id, encode(reply))
        return len(received)

    def _commit_batch(self) -> None:
        """Apply the oldest queued command of each shard (at most
        ``batch_max``) to its machine's state and store every new version in
        one ``compare_and_set_many``; each command gets its own answer (a
        mismatch or a failed store only sends its machine back to its own
        retrying run)."""
        prepared: list[tuple[Queued, LocalMachine, Prepared]] = []
        with contextlib.ExitStack() as held:  # the prepared machines' locks, to the last finish
            for item in self._queue.take(self._batch_max):
                machine = self._shards[item.shard].machine
                try:
                    lock = contextlib.ExitStack()
                    step = lock.enter_context(machine.preparing(item.command))
                    if isinstance(step, Prepared):
                        held.push(lock)
                        prepared.append((item, machine, step))
                        continue
                    with lock:
                        if step is None:
                            self._ran(item, *machine.run_measured(item.command))
                        else:
                            self._ran(item, step, MachineStats())
                except Exception as exc:
                    self._failed(item, exc)
            if not prepared:
                return
            started = time.monotonic()
            try:
                outcomes: list = self._store.compare_and_set_many(
                    [CasRequest(m.shard, step.old.seqno, step.version) for _, m, step in prepared]
                )
            except Exception as exc:  # every machine retries on its own, from the head
                outcomes = [exc] * len(prepared)
            self.batches += 1
            self.window.committed(len(prepared), time.monotonic() - started)
            for (item, machine, step), outcome in zip(prepared, outcomes, strict=True):
                try:
                    self._ran(item, *machine.finish(step, outcome))
                except Exception as exc:
                    self._failed(item, exc)
        self._answer_parked(time.monotonic(), {item.shard for item, _, _ in prepared})

    def _ran(self, item: Queued, result: Result, work: MachineStats) -> None:
        """Answer a command that ran (stored durably, if it changed state)."""
        faults.point("consensus.after_store")
        if item.peer == OWN:
            self._own.answer(item, result)
            return
        self._shards[item.shard].commands += 1
        if self.on_command is not None:
            self.on_command(item.shard, item.command, result, time.monotonic() - item.received)
        self._rpc.reply(item.peer, item.request_id, encode(RunReply(result, work)))

    def _failed(self, item: Queued, exc: Exception) -> None:
        if item.peer == OWN:
            self._own.fail(item, exc)
            return
        self._rpc.reply(item.peer, item.request_id, encode(self._error(item.command, exc)))

    def _error(self, request: object, exc: Exception) -> ErrorReply:
        """The answer to a request that raised ``exc``, counted and logged."""
        self.errors += 1
        kind = error_kind(exc)
        if kind == "internal":
            log.error("request %s failed", type(request).__name__, exc_info=exc)
        else:
            log.warning("request %s failed: %s", type(request).__name__, exc)
        return ErrorReply(kind, f"{type(exc).__name__}: {exc}")

    def _answer_jobs(self) -> None:
        for peer, request_id, done in self._maintenance.done_jobs():
            if isinstance(done, BaseException):
                self.errors += 1
                log.warning("maintenance job failed: %s", done)
                done = ErrorReply(error_kind(done), f"{type(done).__name__}: {done}")
            self._rpc.reply(peer, request_id, encode(done))

    def _handle(self, peer: bytes, request_id: bytes, payload: bytes) -> ServerReply | None:
        try:
            request = decode_request(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.errors += 1
            log.warning(
                "malformed request (%d bytes) from peer %s: %s", len(payload), peer.hex(), exc
            )
            return ErrorReply("bad_request", f"malformed request: {exc}")
        try:
            return self._dispatch(peer, request_id, request)
        except Exception as exc:
            return self._error(request, exc)

    def _dispatch(
        self, peer: bytes, request_id: bytes, request: ServerRequest
    ) -> ServerReply | None:
        if isinstance(request, Ping):
            return Pong(os.getpid())
        if isinstance(request, GetStats):
            return self.stats()
        if isinstance(request, RunTransaction):
            return self._transaction(request)
        if isinstance(request, OpenShard):
            state = self._open(request).machine.state(refresh=True)
            return OpenedReply(state, self.config.writer_lease_ms)
        shard = self._shard(request.shard)
        machine = shard.machine
        if isinstance(request, RunCommand):
            if not isinstance(request.command, CLIENT_COMMANDS):
                raise ValueError(
                    f"{type(request.command).__name__} is maintenance, which this server runs "
                    "itself; clients ask for it (shard gc, shard compact), never send it"
                )
            self._queue.put(
                Queued(peer, request_id, request.shard, request.command, time.monotonic())
            )
            return None
        if isinstance(request, FetchState):
            return StateReply(machine.state(refresh=True))
        if isinstance(request, WaitForUpper):
            state = machine.state(refresh=True)
            if state.upper > request.past or request.timeout_ms <= 0:
                return StateReply(state)
            wait_s = min(request.timeout_ms, MAX_PARK_MS) / 1000
            self._parked.append(
                _Parked(peer, request_id, request.shard, request.past, time.monotonic() + wait_s)
            )
            return None
        if isinstance(request, Maintain):
            self._maintenance.ask(peer, request_id, shard, request)
            return None
        if isinstance(request, ScanVersions):
            versions = machine.versions(request.from_seqno, min(request.limit, MAX_SCAN_VERSIONS))
            return VersionsReply(tuple(Version(v.seqno, v.data) for v in versions))
        raise TypeError(f"unhandled request {type(request).__name__}")

    def _transaction(self, request: RunTransaction) -> TransactionReply:
        """Every item or none, in the loop: its shards' commands queued
        before it are stored first, so it sees them (and none lands inside it)."""
        items = [(item.shard, item.command) for item in request.items]
        while len(self._queue):
            self._commit_batch()
        machines = {shard: self._shard(shard).machine for shard, _ in items}
        results = LocalTransactions(machines, self._store).run_all(items)
        faults.point("transaction.after_store")  # stored, not answered: a retry must find it
        for shard, _ in items:
            self._shards[shard].commands += 1
        self._answer_parked(time.monotonic(), set(machines))
        return TransactionReply(tuple(results))

    def _open(self, request: OpenShard) -> LoadedShard:
        check_served(request.config, self.config, f"shard {request.shard!r}")
        shard = self._shards.get(request.shard)
        if shard is None:
            machine = LocalMachine.open(
                self._store,
                self._blob,
                request.shard,
                schema=request.schema,
                # the served settings and the writers' lease are this server's, not the opener's
                config=msgspec.structs.replace(
                    request.config,
                    writer_lease_ms=self.config.writer_lease_ms,
                    **{name: getattr(self.config, name) for name in SERVED_FIELDS},
                ),
                create=request.create,
                clock=self._clock,
                exclusive=True,
                check_parts=self._check_parts,
            )
            shard = self._shards[request.shard] = LoadedShard(machine)
        return shard

    def _shard(self, name: str) -> LoadedShard:
        """A loaded shard; after a restart, an existing shard loads on first use."""
        shard = self._shards.get(name)
        if shard is None:
            shard = self._open(OpenShard(name, b"", self.config, create=False))
        return shard

    def _answer_parked(self, now: float, shards: set[str] | None = None) -> None:
        """Answer the long polls whose upper moved past (of ``shards``, if
        given) or whose time is up."""
        if not self._parked:
            return
        keep = []
        for parked in self._parked:
            if shards is not None and parked.shard not in shards and parked.deadline > now:
                keep.append(parked)
                continue
            state = self._shards[parked.shard].machine.state(refresh=True)
            if state.upper > parked.past or parked.deadline <= now:
                self._rpc.reply(parked.peer, parked.request_id, encode(StateReply(state)))
            else:
                keep.append(parked)
        self._parked = keep

    # --- stats and lifecycle --------------------------------------------------------

    def stats(self) -> StatsReply:
        """What ``consensus stats`` shows; safe from another thread (metrics
        read it when scraped): the machines are thread-safe."""
        shards = []
        for name, shard in sorted(self._shards.items()):
            state = shard.machine.state(refresh=True)
            shards.append(
                ShardCounters(
                    shard=name,
                    seqno=state.seqno,
                    upper=state.upper,
                    batches=len(state.batches),
                    parts=sum(len(b.parts) for b in state.batches.values()),
                    inline_bytes=state.inline_bytes,
                    readers=len(state.readers),
                    commands=shard.commands,
                    machine=shard.machine.stats(),
                    gc_runs=shard.gc_runs,
                    blobs_deleted=shard.blobs_deleted,
                    leaked_swept=shard.leaked_swept,
                    readers_expired=shard.readers_expired,
                    writers_expired=shard.writers_expired,
                    compactions=shard.compactions,
                    compactions_abandoned=shard.compactions_abandoned,
                    compacted_batches=shard.compacted_batches,
                    compaction_puts=shard.compaction_puts,
                    compaction_put_bytes=shard.compaction_put_bytes,
                    failures=dict(shard.failures),
                    last_failure=shard.last_failure,
                )
            )
        return StatsReply(os.getpid(), self.requests, self.errors, self._rpc.dropped, tuple(shards))

    def close(self) -> None:
        """Stop maintenance, unbind, close the machines and both stores. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._maintenance.close()  # the loop has stopped: merges waiting on it give up
        self._rpc.close()
        for shard in self._shards.values():
            try:  # its leftovers become sweepable now rather than a lease later
                shard.machine.run(ExpireWriter(shard.writer))
            except (StorageError, PersistError) as exc:
                log.warning(
                    "shard %r: could not expire the server's writer: %s", shard.machine.shard, exc
                )
            shard.machine.close()
        self._store.close()
        self._blob.close()
