"""The coordinator: the mint and append operators of a cluster.

One thread, one ZeroMQ ROUTER bound in the run directory. Every builder and
worker connects a DEALER to it. Per interval the coordinator sends one
:class:`~shardsink.protocol.Mint` to each worker, collects one
:class:`~shardsink.protocol.Report` from each, checks them with
:func:`~shardsink.coordinator.accounting.check` and calls compare-and-append
once with every batch of the interval.

Its :class:`~shardsink.coordinator.supervisor.Supervisor` starts and watches
the processes on every poll tick (at most ``POLL_MS`` apart): a group with a
dead member, one that sent a failure, or one whose reports miss the
interval's deadline is killed whole (``killpg``, then every member reaped) and
restarted; the attempt in flight is abandoned (its workers and builders are
told, the blobs of batches reported for it are deleted, batches nobody
reported are left to the leaked-blob sweep) and the interval is minted again
with the next attempt from the shard's upper. A dead consensus process is
restarted on its store; an append whose outcome was unknown is retried with
the same idempotency token, so it takes effect exactly once. The poll loop
heartbeats the coordinator's writer every third of the shard machine's
``writer_lease_ms``, so long intervals and pauses shorter than the lease do not
get it expired; the lease must outlast ``append_retry_s`` (checked at start).

Every attempt is minted with the writer it will be appended as, and its
workers and builders write their parts under that writer's prefix. A writer
expired anyway (the coordinator was paused, or cut off from consensus, past
its lease) stays expired: the coordinator registers a new writer and redoes
the interval, since the leaked-blob sweep may have taken the old one's parts.
An append refused because a part is not in blob is redone too. After an
append whose earlier try may have committed fails, only the blobs the
shard's current state does not reference are deleted.

A workload of several shards appends each interval to all of them in one
transaction (:class:`~shardsink.persist.shards.Transaction`, run by the
consensus process): every worker reports on every shard, each shard's
reports must add up (:func:`~shardsink.coordinator.accounting.check_shards`),
and the coordinator holds a writer of each shard, minted together. All of
the above holds of them together: an unknown outcome retried with the same
tokens, an expired writer renewed (each shard's that expired), and another
writer's interval (``TransactionMismatch``, every shard's upper) followed,
so no shard ever holds an interval another does not. A workload of one
shard appends with its writer alone, never through a transaction.

Another writer on the same shard (a second cluster through the same
consensus server) makes this one a replica: the workloads are deterministic,
so an interval the other writer appended first holds exactly what this
cluster would have appended. Its compare-and-append fails at once with
``UpperMismatch`` (never retried: no retry can change another writer's
upper), the batches of the attempt are deleted, and the coordinator skips to
the shard's new upper. A run ends when the shard's upper is ``intervals``
past where the run found it, whoever appended them, so two clusters started
together end together. A writer of another workload is not detected here;
the read-back at the end of a run (``verify``) is what catches it.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import msgspec
import zmq

from .. import faults, protocol
from .._address import check_address
from .._curve import CurveServer, ephemeral_keys
from ..config import ClusterConfig, check_lease
from ..hosts import RemoteAgent
from ..persist import (
    PartsNotFound,
    PersistError,
    ShardSet,
    TransactionMismatch,
    UpperMismatch,
    WriterExpired,
)
from ..process import (
    Child,
    ConsensusProcess,
    ConsensusStartError,
    Starter,
    log_dir,
    through_restarts,
)
from ..storage import StorageError
from .accounting import (
    Accepted,
    AccountingError,
    check,
    check_shards,
    parts_by_host,
    total,
)
from .appends import AppendCost, Appends, register
from .errors import ClusterError
from .groups import GroupHost, LocalGroups, Sockets
from .ray_groups import RayGroups
from .records import Counters, IntervalRecord
from .supervisor import Supervisor
from .threshold import Threshold, observe, of as threshold_of

log = logging.getLogger(__name__)

POLL_MS = 50
#: How long a closing coordinator waits for its children to exit when asked.
STOP_S = 10.0
T = TypeVar("T")


def interval_of(upper: int, interval_ms: int, shard: str) -> int:
    """The interval that starts at ``upper``; ``ValueError`` if ``upper`` is
    not a multiple of ``interval_ms`` (the shard was written with another)."""
    if upper % interval_ms:
        raise ValueError(
            f"shard {shard!r} has upper {upper}, not a multiple of interval_ms {interval_ms}: "
            "was it written with another interval_ms?"
        )
    return upper // interval_ms


def consensus_call(
    config: ClusterConfig,
    call: Callable[[], T],
    what: str,
    *,
    consensus: ConsensusProcess | None = None,
    revive: Callable[[], object] | None = None,
    wait: Callable[[], None] | None = None,
) -> T:
    """``call()`` through restarts of the cluster's consensus process
    (:func:`~shardsink.process.through_restarts`, for the run's
    ``append_retry_s``): before each try ``revive()`` (default: ``consensus``'s
    :meth:`~shardsink.process.ConsensusProcess.revive`) restarts it if it
    died, as often as it dies; ``wait()`` (default: a sleep of ``POLL_MS``)
    passes between tries. Past that, the last ``StorageError``, or
    :class:`ClusterError` if the last restart failed. With neither ``revive``
    nor ``consensus`` (a running server, not the cluster's): called once."""
    if revive is None:
        if consensus is None:
            return call()
        revive = consensus.revive
    try:
        return through_restarts(
            call,
            revive=revive,
            wait=wait or (lambda: time.sleep(POLL_MS / 1000)),
            for_s=config.append_retry_s,
            what=what,
        )
    except ConsensusStartError as exc:
        raise ClusterError(f"{what}: {exc}") from None


class GroupFailed(Exception):
    """Groups that must be restarted, and why."""

    def __init__(self, groups: dict[int, str]) -> None:
        super().__init__("; ".join(f"group {g}: {why}" for g, why in sorted(groups.items())))
        self.groups = groups


class Coordinator:
    """Drives the groups of one cluster (see the module doc).

    ``shards`` are the coordinator's handles on the workload's shards
    (through the consensus server), in the workload's order; ``appends`` its
    writer of each and its appends as them. ``consensus`` is the consensus
    process to restart when it dies, ``None`` for an external server;
    ``starter`` starts the groups' processes on this machine.
    """

    def __init__(
        self,
        config: ClusterConfig,
        cluster_id: str,
        run_dir: Path,
        shards: ShardSet,
        consensus: ConsensusProcess | None,
        starter: Starter,
        agents: list[RemoteAgent] | None = None,
    ) -> None:
        self.config = config
        self.cluster_id = cluster_id
        self.run_dir = run_dir
        self.shards = shards
        self.names = list(shards.shards)
        first = shards.shard(self.names[0])
        # the machine's lease is the one its writers are expired by (a server's own)
        lease_ms = first.machine.config.writer_lease_ms
        try:
            check_lease(lease_ms, config.append_retry_s)
        except ValueError as exc:
            raise ClusterError(f"the consensus server's writer lease: {exc}") from None
        writers = register(  # nothing to poll yet: a sleep between its tries
            shards,
            f"cluster-{cluster_id}",
            lambda call, what: consensus_call(config, call, what, consensus=consensus),
        )
        self.counters = Counters()
        self._heartbeat_s = lease_ms / 3000
        self._last_heartbeat = time.monotonic()
        self.threshold: Threshold = threshold_of(config.shared_max_bytes)
        self._random = random.Random(config.seed)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted child reuses its id
        self._sock.setsockopt(zmq.LINGER, 0)
        # an unroutable send raises (and is logged) instead of vanishing
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        #: CURVE keys a child connects to :attr:`address` with (``None``: ipc)
        self.child_keys: protocol.CurveKeys | None = None
        self._curve: CurveServer | None = None
        if config.coordinator_bind:  # tcp: CURVE, keys made for this cluster, in memory only
            server_keys, client_keys = ephemeral_keys()
            self._curve = CurveServer(self._ctx, server_keys)
            self._curve.secure(self._sock)
            self._sock.setsockopt(zmq.IPV6, "[" in config.coordinator_bind)  # tcp://[::1]:P
            self._sock.bind(check_address(config.coordinator_bind, for_bind=True, curve=True))
            self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)  # port 0 resolved
            self.child_keys = protocol.CurveKeys.of(client_keys)
        else:
            self.address = f"ipc://{run_dir / 'coord'}"
            self._sock.bind(check_address(self.address, for_bind=True))
        self._current: tuple[int, int] | None = None
        self._minted: tuple[str, ...] = ()  # the writers the current attempt writes as
        # by shard index: (group, worker) -> report
        self._reports: list[dict[tuple[int, int], protocol.Report]] = [{} for _ in self.names]
        self._closed = False
        #: Called at the end of every poll (the cluster's control socket); what it
        #: raises propagates out of the operation in progress, as Ctrl-C does.
        self.on_poll: Callable[[], None] | None = None
        # a part inline in any shard's state is inline in every one's
        inline_max_bytes = min(
            shards.shard(n).state(refresh=False).inline_max_bytes for n in self.names
        )
        sockets = Sockets(config, cluster_id, self.address, inline_max_bytes, self.child_keys)
        host: GroupHost = (
            LocalGroups(sockets, run_dir, starter)
            if agents is None
            else RayGroups(
                sockets, agents, host_timeout_s=config.host_timeout_s, keep=log_dir(run_dir)
            )
        )
        self.supervisor = Supervisor(
            config, host, self._send, self._poll, consensus, poll_ms=POLL_MS
        )
        self.appends = Appends(shards, writers, self._through_restarts, self.counters)

    def start(self) -> None:
        """Start every group and wait until all are ready."""
        self.supervisor.start()

    # --- messages ---------------------------------------------------------------------

    def _send(self, child: Child, msg: msgspec.Struct) -> None:
        identity = child.name.encode()
        try:
            self._sock.send_multipart([identity, protocol.encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # not connected (dead, or not yet up), or its queue full
            log.warning("could not send %s to %s: %s", type(msg).__name__, child.name, exc)

    def _poll(self, timeout_ms: int) -> None:
        """Handle every message that arrives within ``timeout_ms``; run the
        supervision checks."""
        if self._sock.poll(timeout_ms):
            while True:
                try:
                    identity, raw = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except ValueError:  # not two frames
                    continue
                self._handle(identity.decode(errors="replace"), raw)
        self.supervisor.tick()
        self._heartbeat()
        if self.on_poll is not None:
            self.on_poll()

    def _heartbeat(self) -> None:
        """Heartbeat the writers if a third of their lease passed since the
        last try (:meth:`Appends.heartbeat`); a dead consensus process is the
        supervisor's to restart."""
        now = time.monotonic()
        if now - self._last_heartbeat < self._heartbeat_s:
            return
        self._last_heartbeat = now
        self.appends.heartbeat()

    def _handle(self, identity: str, raw: bytes) -> None:
        try:
            msg = protocol.decode_from_child(raw)
        except msgspec.DecodeError as exc:
            log.warning("malformed message from %r: %s", identity, exc)
            return
        member = self.supervisor.member(identity)
        if member is None:
            log.warning("message from unknown peer %r", identity)
            return
        if isinstance(msg, protocol.Hello):
            self.supervisor.on_hello(*member, msg)
        elif isinstance(msg, protocol.Failure):
            self.supervisor.on_failure(*member, msg)
        elif isinstance(msg, protocol.Report):
            key = (msg.group, msg.worker)
            expected = f"g{msg.group}/w{msg.worker}"
            if msg.shard >= len(self.names):
                log.warning(
                    "a report from %s on shard %d, of %d", identity, msg.shard, len(self.names)
                )
            elif (msg.interval, msg.attempt) != self._current or expected != identity:
                self._discard([msg], f"a stale report from {identity}")
            elif key in self._reports[msg.shard]:
                log.warning("a second report from %s for %s; ignored", identity, self._current)
            else:
                self._reports[msg.shard][key] = msg

    def _all_reports(self) -> list[protocol.Report]:
        """Every report of the current attempt so far, of every shard."""
        return [r for by_worker in self._reports for r in by_worker.values()]

    def _discard(
        self, reports: Iterable[protocol.Report], why: str, *, tried: bool = False
    ) -> None:
        """:meth:`Appends.discard`, through consensus restarts from the poll loop."""
        self.appends.discard(reports, why, tried=tried)

    # --- intervals --------------------------------------------------------------------

    def run(self, intervals: int, on_append: Callable[[IntervalRecord], None] | None) -> None:
        """Seal ``intervals`` intervals from the shard's upper on: append each
        one unless another writer appended it first (then skip it)."""
        start = time.monotonic()
        if self.counters.started is None:
            self.counters.started = start
        first = interval_of(self._upper(), self.config.interval_ms, ", ".join(self.names))
        interval = first
        try:
            while interval < first + intervals:
                close = self._due(start, interval - first)
                if close is not None:
                    self._wait_until(close)
                record = self._append_interval(interval, close)
                if record is None:
                    interval = self._follow(interval)
                    continue
                if self.config.rate is not None:  # due by now, and not appended
                    due = min(intervals, int((time.monotonic() - start) * self.config.rate))
                    record = msgspec.structs.replace(
                        record, backlog=max(0, due - (interval - first + 1))
                    )
                self.counters.add(record)
                interval += 1
                if on_append is not None:
                    on_append(record)
        finally:
            self.counters.wall_s += time.monotonic() - start
            self.supervisor.sample_rss(force=True)

    def _due(self, start: float, nth: int) -> float | None:
        """When the ``nth`` interval of a run started at ``start`` is due:
        open loop at ``rate`` intervals a second, or when it closes with
        ``pace`` realtime; ``None`` at ``pace`` max (when the last is appended)."""
        if self.config.rate is not None:
            return start + (nth + 1) / self.config.rate
        if self.config.pace == "realtime":
            return start + (nth + 1) * self.config.interval_ms / 1000
        return None

    def _follow(self, interval: int) -> int:
        """The interval at the shard's upper, which another writer moved past
        ``interval``; its appends are counted as skipped."""
        upper = interval_of(self._upper(), self.config.interval_ms, ", ".join(self.names))
        self.counters.skipped += upper - interval
        log.info(
            "intervals %d to %d were appended by another writer of %s; following it",
            interval,
            upper - 1,
            ", ".join(self.names),
        )
        return upper

    def _wait_until(self, when: float) -> None:
        while (left := when - time.monotonic()) > 0:
            self._poll(min(POLL_MS, max(1, int(left * 1000))))
            failed = self.supervisor.failed_groups()
            if failed:
                self.supervisor.restart(failed)

    def _append_interval(self, interval: int, close: float | None) -> IntervalRecord | None:
        """Mint attempts of ``interval`` until one is appended; ``None`` if
        another writer appended it first."""
        interval_ms = self.config.interval_ms
        lower, upper = interval * interval_ms, (interval + 1) * interval_ms
        attempt: int | None = 0
        while attempt is not None:
            minted = time.monotonic()
            if attempt == 0 and self.config.listen:
                self.counters.minted_at[interval] = minted
            self._mint(interval, attempt, lower, upper)
            try:
                by_shard = self._collect(minted)
                accepted = check_shards(
                    by_shard,
                    self.names,
                    functools.partial(
                        check,
                        groups=self.config.groups,
                        workers=self.config.workers,
                        interval=interval,
                        attempt=attempt,
                        lower=lower,
                        upper=upper,
                        host=self.config.host_builder,
                    ),
                )
            except GroupFailed as failure:
                self._abandon(interval, attempt, str(failure))
                self.supervisor.restart(failure.groups)
            except AccountingError as exc:
                self._abandon(interval, attempt, f"the reports do not add up: {exc}")
            else:
                self._current = None
                reports = [r for by_worker in by_shard for r in by_worker.values()]
                try:
                    cost = self._compare_and_append(accepted, lower, upper)
                except (UpperMismatch, TransactionMismatch) as exc:
                    self._discard(reports, f"interval {interval}: {exc}", tried=True)
                    return None
                except (WriterExpired, PartsNotFound) as exc:
                    log.warning("attempt %d of interval %d refused: %s", attempt, interval, exc)
                    self._discard(reports, f"refused attempt {attempt}", tried=True)
                    if isinstance(exc, WriterExpired):
                        self.appends.renew_expired()
                else:
                    since = close if close is not None else minted
                    by_host = parts_by_host(
                        reports, self.supervisor.host.host_of, self.config.host_builder
                    )
                    record = self._record(interval, attempt, total(accepted), cost, since, by_host)
                    self.threshold = self.threshold.after(observe(reports))
                    return record
            attempt = self._next_attempt(interval, attempt)
        return None

    def _record(
        self,
        interval: int,
        attempt: int,
        accepted: Accepted,
        cost: AppendCost,
        since: float,
        by_host: dict[int, int],
    ) -> IntervalRecord:
        return IntervalRecord(
            interval=interval,
            attempt=attempt,
            rows=accepted.rows,
            own_batches=accepted.own_batches,
            shared_batches=accepted.shared_batches,
            data_parts=cost.data_parts,
            inline_parts=cost.inline_parts,
            inline_bytes=cost.inline_bytes,
            blob_puts=accepted.blob_puts + cost.blob_puts,
            blob_put_bytes=accepted.blob_put_bytes + cost.blob_put_bytes,
            diff_bytes=cost.diff_bytes,
            cas_calls=cost.cas_calls,
            latency_ms=(time.monotonic() - since) * 1000,
            segment_parts=accepted.segment_parts,
            shared_max_bytes=self.threshold.bytes,
            parts_by_host=by_host,
            parts_by_shard=cost.parts_by_shard,
        )

    def _next_attempt(self, interval: int, attempt: int) -> int | None:
        """The attempt after the abandoned ``attempt``; ``None`` if another
        writer appended ``interval`` meanwhile. ``ClusterError`` past
        ``max_restarts`` attempts."""
        self.counters.abandoned += 1
        if self._upper() > interval * self.config.interval_ms:
            return None
        if attempt + 1 > self.config.max_restarts:
            raise ClusterError(f"interval {interval} failed {attempt + 1} attempts")
        return attempt + 1

    def _mint(self, interval: int, attempt: int, lower: int, upper: int) -> None:
        self._current = (interval, attempt)
        self._reports = [{} for _ in self.names]
        self._minted = self.appends.writer_ids()
        mint = protocol.Mint(
            interval=interval,
            attempt=attempt,
            lower=lower,
            upper=upper,
            mode=self.config.mode,
            shared_max_bytes=self.threshold.bytes,
            writers=self._minted,
        )
        workers = [w for group in self.supervisor.groups.values() for w in group.workers]
        self._random.shuffle(workers)
        for worker in workers:
            self._send(worker, mint)

    def _collect(self, minted: float) -> list[dict[tuple[int, int], protocol.Report]]:
        """The reports of the current attempt, by shard index; :class:`GroupFailed`
        if a group fails or misses the deadline."""
        need = self.config.groups * self.config.workers
        deadline = minted + self.config.interval_timeout_s
        while any(len(by_worker) < need for by_worker in self._reports):
            self._poll(POLL_MS)
            failed = self.supervisor.failed_groups()
            if not failed and time.monotonic() > deadline:
                for g in self.supervisor.groups:
                    late = [
                        w
                        for w in range(self.config.workers)
                        if any((g, w) not in by_worker for by_worker in self._reports)
                    ]
                    if late:
                        workers = ", ".join(map(str, late))
                        failed[g] = (
                            f"no report from worker{'s' if len(late) > 1 else ''} {workers} "
                            f"within {self.config.interval_timeout_s}s"
                        )
            if failed:
                raise GroupFailed(failed)
        return [dict(by_worker) for by_worker in self._reports]

    def _abandon(self, interval: int, attempt: int, why: str) -> None:
        log.warning("abandoning attempt %d of interval %d: %s", attempt, interval, why)
        abandon = protocol.Abandon(interval, attempt)
        for child in self.supervisor.members():
            self._send(child, abandon)
        self._discard(self._all_reports(), f"abandoned attempt {attempt}")
        self._reports = [{} for _ in self.names]
        self._current = None  # reports of it that arrive later are discarded too

    def _compare_and_append(self, accepted: list[Accepted], lower: int, upper: int) -> AppendCost:
        """Append ``accepted`` (each shard's, in order) once
        (:meth:`Appends.one_try`); retried through consensus restarts with
        the same idempotency tokens, so a try whose answer was lost makes the
        next one ``AlreadyAppended`` rather than an append twice or a
        mismatch. ``UpperMismatch`` or ``TransactionMismatch`` (another writer
        appended first), ``WriterExpired`` (also when the attempt was minted
        as a writer renewed since) and ``PartsNotFound`` are raised at once."""
        if self._minted != self.appends.writer_ids():
            raise WriterExpired(f"attempt minted as expired writers {self._minted}")
        before = self.appends.stats()
        deadline = time.monotonic() + self.config.append_retry_s
        self.supervisor.check_consensus()
        commit = self.appends.one_try(accepted, lower, upper)
        while True:
            try:
                faults.point("append.before_cas")
                commit()
                faults.point("append.after_cas")
                break
            except (UpperMismatch, TransactionMismatch, WriterExpired, PartsNotFound):
                raise  # no retry changes another writer's upper, or brings a writer or part back
            except (StorageError, PersistError) as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("append of [%d, %d) failed, retrying: %s", lower, upper, exc)
                self._poll(POLL_MS)
        return self.appends.cost(before)

    def _upper(self) -> int:
        return self.appends.upper()

    def _through_restarts(self, call: Callable[[], T], what: str) -> T:
        """:func:`consensus_call` from the poll loop: children are heard and
        a dead consensus process restarted while it waits."""
        return consensus_call(
            self.config,
            call,
            what,
            revive=self.supervisor.revive_consensus,
            wait=lambda: self._poll(POLL_MS),
        )

    # --- shutdown -----------------------------------------------------------------------

    def close(self, timeout_s: float = STOP_S) -> None:
        """Ask every child to exit, kill what does not within ``timeout_s`` (0:
        kill them at once), reap all; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.supervisor.stop(timeout_s)
        finally:
            self.appends.close()
            self._sock.close()
            if self._curve is not None:
                self._curve.close()
            self._ctx.term()
