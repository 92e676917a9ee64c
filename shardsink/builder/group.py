"""The shared batches of one group, driven by the parts its workers send:
:class:`GroupBuilder`, the builder process's state (:mod:`.builder` runs it).

Each part's metadata (:class:`~shardsink.protocol.Contribute`) says which
batch id it belongs to and whether it finishes the worker's handle. The rows
of each shared batch generation go into a
:class:`~shardsink.persist.batches.BatchBuilder` (Parquet parts near the blob
target, or inline when tiny) and every finish gets a
:class:`~shardsink.protocol.Handoff`: the finished batch for the last
finisher, nothing for the others. Who is last is decided by the pure
:class:`~shardsink.builder.shared_batch.SharedBatches`. A part is
acknowledged (its arena space freed) once its rows are written to a part, or
its batch is finished or aborted.

With ``coalesce`` host a group builder passes its finished generations to the
host builder (:class:`~shardsink.builder.host_link.HostLink`) instead of
writing them, and the host builder's :class:`GroupBuilder` builds one batch
per host from the groups' parts, its "workers" being the group builders.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa

from .. import faults, protocol
from ..persist import BatchBuilder, PersistError, ShardStats
from ..shm import DEFAULT_CAPACITY, Received
from ..storage import Blob, StorageError
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
    batch names the group that receives it. ``senders``: how many workers
    (numbered from 0), or their numbers (a host builder's: the groups of its
    host). ``host_index``: the host whose host builder this is, or sends to.

    ``shard``/``shard_index``: the shard whose batches these are (its name,
    its index in the workload's order, which every answer carries); a group
    of a workload of several shards runs one per shard
    (:class:`~shardsink.builder.shards.ShardBuilders`). ``schema``, if
    given, is what every part's rows must have (a part receiver checks one
    schema for all its parts; with several shards each shard's builder
    checks its own).
    """

    def __init__(
        self,
        group: int,
        senders: int | Sequence[int],
        blob: Blob,
        shard: str,
        *,
        inline_max_bytes: int,
        target_bytes: int,
        ack: Callable[..., None],
        linger_s: float = 0.0,
        upstream: HostLink | None = None,
        host: bool = False,
        host_index: int = 0,
        shard_index: int = 0,
        schema: pa.Schema | None = None,
    ) -> None:
        self.group = group
        self.shard_index = shard_index
        self.schema = schema
        self.label = protocol.host_builder_name(host_index) if host else f"group {group}"
        self.upstream = upstream
        self.host = host
        self.host_index = host_index
        self._relays: dict[BatchId, list[_Relay]] = {}
        self.blob = blob
        self.shard = shard
        self.inline_max_bytes = inline_max_bytes
        self.target_bytes = target_bytes
        self.machine = SharedBatches(senders, linger_s=linger_s)
        self._ack = ack
        self._generations: dict[tuple[BatchId, int], _Generation] = {}
        self._failed: dict[tuple[BatchId, int], str] = {}
        # when each finishing part was taken, until its finish is answered: a
        # last finisher's is where the builder's lag starts
        self._finish_taken: dict[tuple[BatchId, int], float] = {}
        self._newest: BatchId | None = None
        self._abandoned: BatchId | None = None
        self._senders = {protocol.worker_identity(w): w for w in self.machine.workers}

    def take(
        self, part: Received, c: protocol.Contribute | None = None
    ) -> tuple[BatchId, int] | None:
        """Take one part (``c``: its metadata, if the caller decoded it
        already); return ``(bid, worker)`` if it finishes the worker's handle
        (decide it with :meth:`finish`). Raises ``msgspec.ValidationError``
        if the part's metadata is not a contribution (the part is released).

        The worker is the one the part's socket names, never the one its
        metadata claims: a part that claims another worker is refused, and the
        sender's handle fails with an error naming both (a sender that is no
        worker of the group is only logged). So is a part of another shard's
        schema."""
        if c is None:
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
        if self.schema is not None and not part.batch.schema.equals(self.schema):
            self._ack(part)
            self._fail(
                (bid, sender), f"a part of worker {sender} is not of shard {self.shard}'s schema"
            )
            return (bid, sender) if c.last else None
        if self._stale(bid):
            self._ack(part)
            return (bid, c.worker) if c.last else None
        if self._newest is None or bid > self._newest:
            self._newest = bid
            swept = self.machine.sweep(lambda b: b >= bid)
            if self.upstream is not None:
                self.upstream.forget(swept, self.shard_index)
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
        return self._handoff(interval, attempt, 0, error=error)

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
                self.group,
                r.generation,
                r.contributors,
                answer.generation,
                r.segment_parts,
                host=self.host_index,
            )
            shared = answer.shared if i == len(waiting) - 1 else None
            handoff = self._handoff(
                answer.interval, answer.attempt, r.generation, shared, answer.error, share
            )
            out.append((r.worker, handoff))
        return out

    def _handoff(
        self,
        interval: int,
        attempt: int,
        generation: int,
        shared: protocol.SharedBatch | None = None,
        error: str | None = None,
        share: protocol.GroupShare | None = None,
    ) -> protocol.Handoff:
        """A :class:`~shardsink.protocol.Handoff` of this builder's shard."""
        return protocol.Handoff(
            interval, attempt, generation, shared, error, share, shard=self.shard_index
        )

    def _resolve(self, r: Resolved) -> protocol.Handoff | None:
        interval, attempt = r.bid
        # only an abandon makes an id stale here: a sweep never forgets an id
        # before its deferred finisher is answered
        if self._abandoned is not None and r.bid <= self._abandoned:
            if isinstance(r.decision, Last):  # handed off, then abandoned before the answer
                self._orphan([Orphaned(r.bid, r.decision.generation)])
            error = f"attempt {attempt} of interval {interval} was abandoned"
            return self._handoff(interval, attempt, 0, error=error)
        return self._answer(r.bid, r.worker, r.decision)

    def _answer(
        self, bid: BatchId, worker: int, decision: NotLast | Last
    ) -> protocol.Handoff | None:
        interval, attempt = bid
        taken = self._finish_taken.pop((bid, worker), None)
        if isinstance(decision, NotLast):
            return self._handoff(interval, attempt, decision.generation)
        assert isinstance(decision, Last)
        if self.upstream is not None:
            try:
                self._forward(bid, worker, decision)
            except ValueError as exc:
                return self._handoff(
                    interval, attempt, decision.generation, error=f"{type(exc).__name__}: {exc}"
                )
            return None
        try:
            shared = self._complete(bid, worker if self.host else self.group, decision, taken)
        except (ValueError, PersistError, StorageError) as exc:
            return self._handoff(
                interval, attempt, decision.generation, error=f"{type(exc).__name__}: {exc}"
            )
        return self._handoff(interval, attempt, decision.generation, shared=shared)

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
            self.upstream.forget([bid, *gone], self.shard_index)

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
            self.upstream.join(bid, description, self.shard_index)
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
            self.upstream.forward(
                bid, rows, finish=self.machine.settled(bid), shard=self.shard_index
            )
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
            host=self.host_index if self.host else 0,
        )

    def _orphan(self, orphaned: list[Orphaned]) -> None:
        for o in orphaned:
            gen = self._generations.pop((o.bid, o.generation), None)
            if gen is not None:
                keys = gen.builder.abort() if gen.builder is not None else []
                self._ack(*gen.held)
                if keys:
                    log.info("%s: deleted the %d parts of %s", self.label, len(keys), o)
