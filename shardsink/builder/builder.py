"""The builder process of a group: shared batches from its workers' parts.

Workers send their parts through the shared-memory channel; each part's
metadata (:class:`~shardsink.protocol.Contribute`) says which batch id
it belongs to and whether it finishes the worker's handle. The builder feeds
the rows of each shared batch generation into a
:class:`~shardsink.persist.batches.BatchBuilder` (Parquet parts near the blob
target, or inline when tiny) and answers every finish with a
:class:`~shardsink.protocol.Handoff`: the finished batch for the last
finisher, nothing for the others. Who is last is decided by the pure
:class:`~shardsink.builder.shared_batch.SharedBatches`.

Finishes that arrive in one burst are decided after every part of the burst
has joined, so workers whose parts overlap in time share one batch in
best-effort mode; with a linger, a best-effort finish that would hand the
batch off before every worker joined waits up to ``linger_s`` for the others
(the builder's poll loop runs the machine's clock). A part is acknowledged
(its arena space freed) once its rows are written to a part, or its batch is
finished or aborted: the builder holds at most the channel's outstanding parts
plus one part in progress.

With ``coalesce`` host the same code runs twice over: each group builder
passes its finished generations to the host builder
(:class:`~shardsink.builder.host_link.HostLink`) instead of writing them, and
the host builder (:func:`run_builder` with ``host``) builds one batch per
host from the groups' parts, its "workers" being the group builders. The
host builder answers the group builder that finished last with the host
batch, and that group builder relays it to the last finisher of its
generation, which reports it to the coordinator.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa
import zmq

from .. import faults, protocol
from .._address import check_address
from ..persist.batches import BatchBuilder
from ..persist.errors import PersistError
from ..persist.stats import ShardStats
from ..process.roles import enter_member
from ..shm import DEFAULT_CAPACITY, PartReceiver, Received
from ..storage.contracts import Blob
from ..storage.errors import StorageError
from .host_link import HostLink
from .shared_batch import (
    BatchId,
    Deferred,
    Description,
    Last,
    NotLast,
    Orphaned,
    Resolved,
    SharedBatches,
)

log = logging.getLogger(__name__)

#: How long the builder waits for a part before it looks at its other sockets.
POLL_S = 0.05
#: Held parts of one sender past which a part is written, so that the sender
#: gets its arena back. A sender's parts stay in its arena until acknowledged,
#: and its 4 MiB parts fit one per 8 MiB segment, so the arena holds about half
#: its capacity of them: waiting for ``blob_target_bytes`` would leave a worker
#: sharing more than that waiting for acknowledgements that never come.
HELD_PER_SENDER_MAX = DEFAULT_CAPACITY // 4


@dataclass
class _Generation:
    builder: BatchBuilder | None  # None with coalesce host: the rows go to the host builder
    held: list[Received] = field(default_factory=list)
    held_bytes: Counter[bytes] = field(default_factory=Counter)  # by sender
    segment_parts: int = 0  # parts with rows that came through a segment
    error: str | None = None  # writing a part failed: nobody may receive this batch
    copied: list[pa.RecordBatch] = field(default_factory=list)  # coalesce host: rows held apart

    def copy_held(self, ack: Callable[..., None]) -> None:
        """Copy the held parts out of their senders' arenas and release them."""
        self.copied.append(pa.concat_batches([p.batch for p in self.held]))
        ack(*self.held)
        self.held.clear()
        self.held_bytes.clear()


@dataclass(frozen=True)
class _Relay:
    """A generation passed to the host builder: its last finisher waits for
    the host's answer."""

    worker: int
    generation: int
    contributors: dict[int, int]
    segment_parts: int


class GroupBuilder:
    """The shared batches of one group, driven by received parts.

    ``ack`` releases parts back to their senders. Call :meth:`take` for every
    part in arrival order; it returns the finishes to decide (after the rest
    of the burst) with :meth:`finish`, each giving the answer for one worker
    or ``None`` if the answer is deferred; deferred answers come from
    :meth:`resolved`, once a later finish, drop, abandon or :meth:`expire`
    decides them.

    With ``upstream`` (``coalesce`` host) the builder writes nothing: it holds
    each generation's rows (copying a sender's parts out of its arena past
    :data:`HELD_PER_SENDER_MAX`) and on its last finish passes them to the
    host builder; the last finisher's answer waits for the host builder's,
    which :meth:`relay` turns into it (with the host batch if this group
    finished last there). The group's host handle on an id is finished once
    every worker of the group is done with it (:meth:`_forward`). ``host``:
    this is the host builder, whose workers are the group builders; a finished
    batch names the group that receives it.
    """

    def __init__(
        self,
        group: int,
        n_workers: int,
        blob: Blob,
        shard: str,
        *,
        inline_max_bytes: int,
        target_bytes: int,
        ack: Callable[..., None],
        linger_s: float = 0.0,
        upstream: HostLink | None = None,
        host: bool = False,
    ) -> None:
        self.group = group
        self.label = "host" if host else f"group {group}"
        self.upstream = upstream
        self.host = host
        self._relays: dict[BatchId, list[_Relay]] = {}
        self.blob = blob
        self.shard = shard
        self.inline_max_bytes = inline_max_bytes
        self.target_bytes = target_bytes
        self.machine = SharedBatches(n_workers, linger_s=linger_s)
        self._ack = ack
        self._generations: dict[tuple[BatchId, int], _Generation] = {}
        self._failed: dict[tuple[BatchId, int], str] = {}
        # when each finishing part was taken, until its finish is answered: a
        # last finisher's is where the builder's lag starts
        self._finish_taken: dict[tuple[BatchId, int], float] = {}
        self._newest: BatchId | None = None
        self._abandoned: BatchId | None = None
        self._senders = {protocol.worker_identity(w): w for w in range(n_workers)}

    def take(self, part: Received) -> tuple[BatchId, int] | None:
        """Take one part; return ``(bid, worker)`` if it finishes the worker's
        handle (decide it with :meth:`finish`). Raises ``msgspec.ValidationError``
        if the part's metadata is not a contribution (the part is released).

        The worker is the one the part's socket names, never the one its
        metadata claims: a part that claims another worker is refused, and the
        sender's handle fails with an error naming both (a sender that is no
        worker of the group is only logged)."""
        try:
            c = protocol.decode_contribute(part.meta)
        except msgspec.ValidationError:
            self._ack(part)
            raise
        bid = (c.interval, c.attempt)
        sender = self._senders.get(part.sender)
        if sender != c.worker:
            self._ack(part)
            reason = (
                f"a part from sender {part.sender.decode(errors='replace')!r} says it is "
                f"worker {c.worker}'s; refused"
            )
            if sender is None:
                log.warning("%s: %s", self.label, reason)
                return None
            self._fail((bid, sender), reason)
            return (bid, sender) if c.last else None
        if self._stale(bid):
            self._ack(part)
            return (bid, c.worker) if c.last else None
        if self._newest is None or bid > self._newest:
            self._newest = bid
            swept = self.machine.sweep(lambda b: b >= bid)
            if self.upstream is not None:
                self.upstream.forget(swept)
        key = (bid, c.worker)
        if c.last:
            self._finish_taken[key] = time.monotonic()
        if key not in self._failed:
            try:
                self._add(bid, c, part)
            except (ValueError, PersistError, StorageError) as exc:
                self._ack(part)
                self._fail(key, f"{type(exc).__name__}: {exc}")
        else:
            self._ack(part)
        return key if c.last else None

    def finish(self, bid: BatchId, worker: int, now: float = 0.0) -> protocol.Handoff | None:
        """The answer to ``worker``'s finish of ``bid`` at time ``now``;
        ``None`` while it is deferred."""
        interval, attempt = bid
        error = self._failed.pop((bid, worker), None)
        if error is None and self._stale(bid):
            error = f"attempt {attempt} of interval {interval} was abandoned"
        if error is None:
            try:
                decision = self.machine.finish(bid, worker, now)
            except ValueError as exc:  # e.g. a second finish of one handle
                error = f"{type(exc).__name__}: {exc}"
            else:
                if isinstance(decision, Deferred):
                    return None
                return self._answer(bid, worker, decision)
        self._finish_taken.pop((bid, worker), None)
        return protocol.Handoff(interval, attempt, 0, error=error)

    def expire(self, now: float) -> None:
        """End the lingers that ran out by ``now``."""
        self.machine.expire(now)

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has something to do, if ever."""
        return self.machine.next_deadline()

    def resolved(self) -> list[tuple[int, protocol.Handoff]]:
        """``(worker, answer)`` for every deferred finish decided since the last call."""
        answers = [(r.worker, self._resolve(r)) for r in self.machine.take_resolved()]
        return [(worker, answer) for worker, answer in answers if answer is not None]

    def relay(self, answer: protocol.Handoff) -> list[tuple[int, protocol.Handoff]]:
        """The host builder's ``answer`` to this group's finish of a batch id,
        as ``(worker, answer)`` for the last finisher of each generation the
        group passed on for it: each learns the host generation its rows went
        into, and the last generation's gets the host batch if this group
        finished last at the host builder. Empty for an answer nobody waits
        for (its attempt was abandoned)."""
        bid = (answer.interval, answer.attempt)
        waiting = self._relays.pop(bid, None)
        if not waiting:
            log.info("%s: the host builder answered %s; nobody waits for it", self.label, bid)
            return []
        if answer.shared is not None:
            faults.point("builder.host_last")
        out = []
        for i, r in enumerate(waiting):
            share = protocol.GroupShare(
                self.group, r.generation, r.contributors, answer.generation, r.segment_parts
            )
            shared = answer.shared if i == len(waiting) - 1 else None
            handoff = protocol.Handoff(
                answer.interval, answer.attempt, r.generation, shared, answer.error, share
            )
            out.append((r.worker, handoff))
        return out

    def _resolve(self, r: Resolved) -> protocol.Handoff | None:
        interval, attempt = r.bid
        # only an abandon makes an id stale here: a sweep never forgets an id
        # before its deferred finisher is answered
        if self._abandoned is not None and r.bid <= self._abandoned:
            if isinstance(r.decision, Last):  # handed off, then abandoned before the answer
                self._orphan([Orphaned(r.bid, r.decision.generation)])
            error = f"attempt {attempt} of interval {interval} was abandoned"
            return protocol.Handoff(interval, attempt, 0, error=error)
        return self._answer(r.bid, r.worker, r.decision)

    def _answer(
        self, bid: BatchId, worker: int, decision: NotLast | Last
    ) -> protocol.Handoff | None:
        interval, attempt = bid
        taken = self._finish_taken.pop((bid, worker), None)
        if isinstance(decision, NotLast):
            return protocol.Handoff(interval, attempt, decision.generation)
        assert isinstance(decision, Last)
        if self.upstream is not None:
            try:
                self._forward(bid, worker, decision)
            except ValueError as exc:
                return protocol.Handoff(
                    interval, attempt, decision.generation, error=f"{type(exc).__name__}: {exc}"
                )
            return None
        try:
            shared = self._complete(bid, worker if self.host else self.group, decision, taken)
        except (ValueError, PersistError, StorageError) as exc:
            return protocol.Handoff(
                interval, attempt, decision.generation, error=f"{type(exc).__name__}: {exc}"
            )
        return protocol.Handoff(interval, attempt, decision.generation, shared=shared)

    def abandon(self, bid: BatchId) -> None:
        """Abort every shared batch of ``bid``; later parts of it are stale."""
        self._abandoned = bid if self._abandoned is None else max(self._abandoned, bid)
        self._orphan(self.machine.abandon(bid))
        for key in [k for k in self._finish_taken if k[0] <= self._abandoned]:
            del self._finish_taken[key]
        gone = [b for b in self._relays if b <= self._abandoned]
        for b in gone:
            del self._relays[b]
        if self.upstream is not None:
            self.upstream.forget([bid, *gone])

    def close(self) -> None:
        """Abort everything not handed off (deleting its parts); idempotent."""
        for bid in self.machine.ids:
            self._orphan(self.machine.abandon(bid))

    def _stale(self, bid: BatchId) -> bool:
        """An abandoned id, or an older one that is done and forgotten."""
        if self._abandoned is not None and bid <= self._abandoned:
            return True
        return self._newest is not None and bid < self._newest and bid not in self.machine

    def _add(self, bid: BatchId, c: protocol.Contribute, part: Received) -> None:
        if part.batch.num_rows != c.rows:
            raise ValueError(
                f"a part of worker {c.worker} says {c.rows} rows and holds {part.batch.num_rows}"
            )
        description = Description(c.lower, c.upper, bool(c.barrier), c.writer)
        generation = self.machine.join(bid, description, c.worker)
        self.machine.push(bid, c.worker, c.rows)
        if self.upstream is not None:
            self.upstream.join(bid, description)
        if not c.rows:
            self._ack(part)
            return
        gen = self._generations.get((bid, generation))
        if gen is None:
            builder = None
            if self.upstream is None:
                builder = BatchBuilder(
                    self.blob,
                    self.shard,
                    c.writer,
                    c.lower,
                    c.upper,
                    inline_max_bytes=self.inline_max_bytes,
                    target_bytes=self.target_bytes,
                    stats=ShardStats(),
                )
            gen = self._generations[(bid, generation)] = _Generation(builder)
        if gen.error is not None:
            self._ack(part)
            return
        gen.held.append(part)
        gen.held_bytes[part.sender] += part.batch.nbytes
        gen.segment_parts += part.ref is not None
        if gen.builder is None:
            if gen.held_bytes[part.sender] >= HELD_PER_SENDER_MAX:
                gen.copy_held(self._ack)
            return
        try:
            written = gen.builder.add(
                part.batch, write=gen.held_bytes[part.sender] >= HELD_PER_SENDER_MAX
            )
        except (ValueError, PersistError, StorageError) as exc:
            gen.error = f"{type(exc).__name__}: {exc}"
            gen.builder.abort()
            written = True
        if written:
            self._ack(*gen.held)
            gen.held.clear()
            gen.held_bytes.clear()
            if gen.error is None:
                faults.point("builder.after_upload")

    def _fail(self, key: tuple[BatchId, int], reason: str) -> None:
        bid, worker = key
        self._failed[key] = reason
        log.warning("%s: batch id %s, worker %d: %s", self.label, bid, worker, reason)
        try:
            orphaned = self.machine.drop(bid, worker)
        except ValueError:  # it never joined (e.g. a conflicting description)
            return
        if orphaned is not None:
            self._orphan([orphaned])

    def _forward(self, bid: BatchId, worker: int, decision: Last) -> None:
        """Pass a finished generation to the host builder, finishing the
        group's host handle once every worker of the group is done with
        ``bid``: all the group's rows of an interval go into one host batch,
        and a worker late for one generation of its group does not make a
        second host batch (the append waits for its report anyway).
        ``worker``'s answer waits for the host's (:meth:`relay`)."""
        gen = self._generations.pop((bid, decision.generation), None)
        assert self.upstream is not None
        rows = [] if gen is None else [*gen.copied, *(p.batch for p in gen.held)]
        try:
            self.upstream.forward(bid, rows, finish=self.machine.settled(bid))
        finally:
            if gen is not None:
                self._ack(*gen.held)  # the sender copied them into its arena or message
        relay = _Relay(
            worker, decision.generation, decision.contributors, gen.segment_parts if gen else 0
        )
        self._relays.setdefault(bid, []).append(relay)

    def _complete(
        self, bid: BatchId, group: int, decision: Last, taken: float | None
    ) -> protocol.SharedBatch | None:
        """The finished batch of a generation, named as ``group``'s; ``None``
        if nobody added rows. ``taken``: when the last finisher's finishing
        part was taken."""
        gen = self._generations.pop((bid, decision.generation), None)
        if gen is None:
            return None
        assert gen.builder is not None
        try:
            if gen.error is not None:
                raise ValueError(f"writing the shared batch failed: {gen.error}")
            try:
                batch = gen.builder.finish()
            except BaseException:
                gen.builder.abort()
                raise
        finally:
            # the held parts are views into the workers' arenas: released once read
            self._ack(*gen.held)
        if batch.blob_keys():
            faults.point("builder.after_upload")
        return protocol.SharedBatch(
            group=group,
            generation=decision.generation,
            batch=batch,
            contributors=decision.contributors,
            blob_puts=gen.builder.stats.blob_puts,
            blob_put_bytes=gen.builder.stats.blob_put_bytes,
            segment_parts=gen.segment_parts,
            lag_s=0.0 if taken is None else time.monotonic() - taken,
        )

    def _orphan(self, orphaned: list[Orphaned]) -> None:
        for o in orphaned:
            gen = self._generations.pop((o.bid, o.generation), None)
            if gen is not None:
                keys = gen.builder.abort() if gen.builder is not None else []
                self._ack(*gen.held)
                if keys:
                    log.info("%s: deleted the %d parts of %s", self.label, len(keys), o)


def main(payload: bytes) -> int:
    """A group builder's process main (:data:`~shardsink.protocol.BUILDER_ROLE`):
    ``payload`` is its :class:`~shardsink.protocol.ChildSpec`; its exit status."""
    spec = protocol.decode_spec(payload)
    enter_member("builder", f"g{spec.group}")
    return run_builder(spec)


def host_main(payload: bytes) -> int:
    """The host builder's process main (:data:`~shardsink.protocol.HOST_BUILDER_ROLE`,
    ``coalesce`` host): ``payload`` is its :class:`~shardsink.protocol.ChildSpec`."""
    spec = protocol.decode_spec(payload)
    enter_member("builder", "host")
    return run_builder(spec, host=True)


def run_builder(spec: protocol.ChildSpec, *, host: bool = False) -> int:
    """The builder process's main loop; returns the exit code. ``host``: the
    host builder (``coalesce`` host), whose workers are the group builders;
    otherwise group ``spec.group``'s builder, connected to the host builder
    when ``spec.host_parts`` names one."""
    from ..faults import open_blob
    from ..workloads import SCHEMA

    config = spec.config
    name = "host" if host else f"g{spec.group}"
    ctx = zmq.Context()
    coord = ctx.socket(zmq.DEALER)
    coord.setsockopt(zmq.IDENTITY, (name if host else f"{name}/b").encode())
    coord.setsockopt(zmq.LINGER, 1000)
    handoff = ctx.socket(zmq.ROUTER)
    handoff.setsockopt(zmq.ROUTER_MANDATORY, 1)
    handoff.setsockopt(zmq.LINGER, 0)
    receiver: PartReceiver | None = None
    group: GroupBuilder | None = None
    upstream = HostLink(spec, ctx) if spec.host_parts and not host else None
    blob = open_blob(config.blob_uri)
    try:
        coord.connect(spec.coordinator)
        handoff.bind(check_address(spec.handoff, for_bind=True))
        coord.send(protocol.encode(protocol.Hello("builder", spec.group, 0, os.getpid())))
        members = _wait_members(coord, handoff, config.start_timeout_s)
        if members is None:
            return 0
        receiver = PartReceiver(
            spec.parts, spec.cluster_id, creators=members.worker_pids, schema=SCHEMA
        )
        if upstream is not None:
            upstream.connect(config.start_timeout_s)
        group = GroupBuilder(
            spec.group,
            config.groups if host else config.workers,
            blob,
            config.shard,
            inline_max_bytes=spec.inline_max_bytes,
            target_bytes=config.blob_target_bytes,
            ack=receiver.ack,
            linger_s=config.best_effort_linger_ms / 1000,
            upstream=upstream,
            host=host,
        )
        _loop(receiver, group, coord, handoff)
        return 0
    except Exception as exc:
        log.exception("builder %s failed", name)
        _report_failure(coord, f"builder {name}: {type(exc).__name__}: {exc}")
        return 1
    finally:
        if group is not None:
            group.close()
        if receiver is not None:
            receiver.close()
        if upstream is not None:
            upstream.close()
        blob.close()
        coord.close()
        handoff.close()
        ctx.term()


def _wait_members(
    coord: zmq.Socket, handoff: zmq.Socket, timeout_s: float
) -> protocol.Members | None:
    """Welcome workers until the coordinator sends the group's member pids;
    ``None`` on :class:`Shutdown`. ``TimeoutError`` after ``timeout_s``."""
    poller = zmq.Poller()
    poller.register(coord, zmq.POLLIN)
    poller.register(handoff, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        events = dict(poller.poll(int(left * 1000) + 1))
        if handoff in events:
            _welcome(handoff)
        if coord in events:
            try:
                msg = protocol.decode_to_child(coord.recv())
            except msgspec.DecodeError as exc:
                log.warning("malformed message from the coordinator: %s", exc)
                continue
            if isinstance(msg, protocol.Members):
                return msg
            if isinstance(msg, protocol.Shutdown):
                return None
    raise TimeoutError(f"no member list from the coordinator within {timeout_s}s")


def _welcome(handoff: zmq.Socket) -> None:
    """Answer every queued :class:`HandoffHello` with a :class:`Welcome`."""
    while True:
        try:
            frames = handoff.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            peer, raw = frames
            protocol.decode_handoff_hello(raw)
        except (ValueError, msgspec.DecodeError) as exc:
            log.warning("malformed handoff hello: %s", exc)
            continue
        handoff.send_multipart([peer, protocol.encode(protocol.Welcome())])


def _loop(
    receiver: PartReceiver, group: GroupBuilder, coord: zmq.Socket, handoff: zmq.Socket
) -> None:
    upstream = group.upstream
    while True:
        burst: list[tuple[BatchId, int]] = []
        finishing: set[bytes] = set()  # senders with a finish in the burst
        deadline = group.next_deadline()
        wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
        if upstream is None:
            part = receiver.recv(max(0.0, wait))
        else:  # the host builder's answers wake the loop as parts do
            ready = [(receiver.socket, zmq.POLLIN), (upstream.socket, zmq.POLLIN)]
            zmq.zmq_poll(ready, max(0, int(wait * 1000)))
            part = receiver.recv(0)
        while part is not None:
            if part.sender in finishing:
                # a group builder may finish a handle and join again in one
                # burst: its finish is decided before its next join is taken
                _decide(group, handoff, burst)
                finishing.clear()
            try:
                finish = group.take(part)
            except msgspec.ValidationError as exc:
                log.warning("%s: a part without a valid contribution: %s", group.label, exc)
                finish = None
            if finish is not None:
                burst.append(finish)
                finishing.add(part.sender)
            part = receiver.recv(0)
        _decide(group, handoff, burst)
        group.expire(time.monotonic())
        stop = _handle_coordinator(group, coord)
        answers = group.resolved()
        if upstream is not None:
            answers += [a for h in upstream.answers() for a in group.relay(h)]
        for worker, answer in answers:
            _send(handoff, group, worker, answer)
        if stop:
            return
        _welcome(handoff)


def _decide(group: GroupBuilder, handoff: zmq.Socket, burst: list[tuple[BatchId, int]]) -> None:
    """Decide and answer the finishes of ``burst``, emptying it."""
    now = time.monotonic()
    for bid, worker in burst:
        answer = group.finish(bid, worker, now)
        if answer is not None:
            _send(handoff, group, worker, answer)
    burst.clear()


def _send(handoff: zmq.Socket, group: GroupBuilder, worker: int, answer: protocol.Handoff) -> None:
    if answer.shared is not None:
        faults.point("builder.before_handoff")
    try:
        handoff.send_multipart([protocol.worker_identity(worker), protocol.encode(answer)])
    except zmq.ZMQError as exc:  # the worker is gone; its group is being restarted
        log.warning("%s: cannot answer worker %d: %s", group.label, worker, exc)


def _handle_coordinator(group: GroupBuilder, coord: zmq.Socket) -> bool:
    """Handle queued coordinator messages; ``True`` on :class:`Shutdown`."""
    for msg in protocol.queued(coord, protocol.decode_to_child, f"{group.label}'s coordinator"):
        if isinstance(msg, protocol.Shutdown):
            return True
        if isinstance(msg, protocol.Abandon):
            group.abandon((msg.interval, msg.attempt))
    return False


def _report_failure(coord: zmq.Socket, reason: str) -> None:
    with contextlib.suppress(zmq.ZMQError):
        coord.send(protocol.encode(protocol.Failure(os.getpid(), reason)), zmq.NOBLOCK)
