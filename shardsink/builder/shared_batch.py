"""Who receives a shared batch: the pure state machine of a group's builder.

Per batch id (interval, attempt) the machine tracks *generations*: the shared
batches built for that id one after another. Each generation has the set of
open handles (workers that joined and have not finished), its contributors
(worker -> rows pushed) and whether it was handed off. Operations return
decisions; the builder process carries them out (writes parts, answers
workers). Nothing here does I/O, so every interleaving can be tested.

Modes:

- best-effort: ``join`` opens a handle on the id's current generation if it is
  not handed off yet, else starts the next generation. ``finish`` closes the
  handle; the finisher that closes the last open handle is the last finisher
  and receives the generation (:class:`Last`); every other gets
  :class:`NotLast`.
  With a linger (``linger_s`` > 0), a finish that would be last while fewer
  than ``n_workers`` workers have joined the id is :class:`Deferred` instead:
  the generation stays open until ``linger_s`` after its first deferral, so a
  worker that is slow to start its part still joins it. Whoever ends up last
  receives it (a joiner that finishes, or the deferred finisher once
  :meth:`expire` passes the deadline); a deferred finish is answered later
  through :meth:`take_resolved`.
- barrier: one generation per id. Every one of the group's ``n_workers``
  finishes once (with data or with nothing); the one that completes the set
  receives the generation.

Who is last is decided only from the explicit handle sets, never from a count
that anything else can raise in passing, and :meth:`sweep` only forgets ids
that are completely done, so no cleanup can make every finisher believe it is
not last (the bug of the reference design, where a sweep's temporary
reference did exactly that and an interval was sealed with no data). Only an
explicit :meth:`abandon` ends an id that is still in progress. A generation
nobody can receive any more (its last open handle was dropped, or its id was
abandoned) is reported :class:`Orphaned` exactly once, so its parts are
deleted instead of silently lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

BatchId = tuple[int, int]
"""(interval, attempt); the builder's group, cluster and shard are fixed."""


@dataclass(frozen=True)
class Description:
    """What a batch id describes: the interval ``[lower, upper)``, its mode
    and the writer its parts are written as."""

    lower: int
    upper: int
    barrier: bool
    writer: str = ""


class ConflictingDescription(ValueError):
    """Two different descriptions were given for one batch id."""


class ProtocolError(ValueError):
    """An operation that the protocol forbids: finishing twice, pushing without
    an open handle, an unknown worker."""


@dataclass(frozen=True)
class NotLast:
    """The finisher is not last: it receives nothing."""

    generation: int


@dataclass(frozen=True)
class Last:
    """The finisher is last: finish ``generation`` and hand it to this worker.
    ``contributors`` maps each worker that pushed rows to its row count."""

    generation: int
    contributors: dict[int, int]


@dataclass(frozen=True)
class Deferred:
    """The finisher may be last: its answer comes later as a :class:`Resolved`."""

    generation: int


@dataclass(frozen=True)
class Resolved:
    """The answer to ``worker``'s deferred finish of ``bid``."""

    bid: BatchId
    worker: int
    decision: NotLast | Last


@dataclass(frozen=True)
class Orphaned:
    """Nobody will receive ``generation`` of ``bid``: abort it."""

    bid: BatchId
    generation: int


@dataclass
class _Generation:
    number: int
    open: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    contributors: dict[int, int] = field(default_factory=dict)
    closed: bool = False  # handed off or orphaned
    deferred: int | None = None  # the finisher whose answer waits for the linger
    deadline: float | None = None  # set by the first deferral, never extended


@dataclass
class _Entry:
    description: Description
    generations: list[_Generation]
    joined: set[int] = field(default_factory=set)

    @property
    def current(self) -> _Generation:
        return self.generations[-1]


class SharedBatches:
    """The shared batches of one group (see module doc): ``workers`` is how
    many, numbered from 0, or their numbers (a host builder's are the
    groups that send to it)."""

    def __init__(self, workers: int | Iterable[int], *, linger_s: float = 0.0) -> None:
        self.workers = frozenset(range(workers) if isinstance(workers, int) else workers)
        if not self.workers:
            raise ValueError(f"a group needs at least one worker, got {workers!r}")
        if linger_s < 0:
            raise ValueError(f"linger_s must be >= 0, got {linger_s}")
        self.n_workers = len(self.workers)
        self.linger_s = linger_s
        self._entries: dict[BatchId, _Entry] = {}
        self._resolved: list[Resolved] = []

    def __contains__(self, bid: BatchId) -> bool:
        return bid in self._entries

    @property
    def ids(self) -> list[BatchId]:
        return sorted(self._entries)

    def join(self, bid: BatchId, description: Description, worker: int) -> int:
        """Open ``worker``'s handle on ``bid`` (a no-op if it is open); return
        the generation it joined. Raises :class:`ConflictingDescription` if
        ``bid`` is known with another description, :class:`ProtocolError` for
        an unknown worker or one that already finished the barrier."""
        self._check_worker(worker)
        entry = self._entries.get(bid)
        if entry is None:
            entry = self._entries[bid] = _Entry(description, [_Generation(0)])
        elif entry.description != description:
            raise ConflictingDescription(
                f"batch id {bid} is described as {entry.description} and as {description}"
            )
        gen = entry.current
        if worker in gen.open:
            return gen.number
        if description.barrier:
            if worker in gen.finished:
                raise ProtocolError(f"worker {worker} already finished barrier batch {bid}")
        elif gen.closed:
            gen = _Generation(gen.number + 1)
            entry.generations.append(gen)
        gen.open.add(worker)
        entry.joined.add(worker)
        return gen.number

    def push(self, bid: BatchId, worker: int, rows: int) -> None:
        """Record that ``worker`` added ``rows`` rows through its open handle
        (to the generation :meth:`join` returned)."""
        if rows < 0:
            raise ProtocolError(f"worker {worker} pushed {rows} rows")
        gen = self._open_generation(bid, worker)
        if rows:
            gen.contributors[worker] = gen.contributors.get(worker, 0) + rows

    def finish(self, bid: BatchId, worker: int, now: float = 0.0) -> NotLast | Last | Deferred:
        """Close ``worker``'s handle at time ``now``. :class:`Last` for the
        finisher that receives the generation, :class:`NotLast` for every
        other, :class:`Deferred` while a best-effort linger holds it open."""
        entry = self._entries.get(bid)
        gen = self._open_generation(bid, worker)
        gen.open.discard(worker)
        gen.finished.add(worker)
        if gen.closed:  # orphaned by a dropped barrier handle: nobody receives it
            return NotLast(gen.number)
        assert entry is not None
        done = len(gen.finished) == self.n_workers if entry.description.barrier else not gen.open
        if not done:
            return NotLast(gen.number)
        self._release_deferred(bid, gen)
        if self._lingers(entry, gen, now):
            gen.deferred = worker
            if gen.deadline is None:
                gen.deadline = now + self.linger_s
            return Deferred(gen.number)
        gen.closed = True
        return Last(gen.number, dict(gen.contributors))

    def expire(self, now: float) -> None:
        """End every linger that ran out by ``now`` (see :meth:`take_resolved`):
        its deferred finisher is last, unless a worker joined during the linger
        and still holds a handle, in which case that worker will be."""
        for bid, entry in self._entries.items():
            for gen in entry.generations:
                if gen.deferred is None or gen.deadline is None or gen.deadline > now:
                    continue
                if gen.open:
                    self._release_deferred(bid, gen)
                else:
                    self._hand_to_deferred(bid, gen)

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`expire` has something to do, if any."""
        deadlines = [
            g.deadline
            for entry in self._entries.values()
            for g in entry.generations
            if g.deferred is not None and g.deadline is not None
        ]
        return min(deadlines, default=None)

    def take_resolved(self) -> list[Resolved]:
        """The answers to deferred finishes decided since the last call."""
        resolved, self._resolved = self._resolved, []
        return resolved

    def drop(self, bid: BatchId, worker: int) -> Orphaned | None:
        """Close ``worker``'s handle without finishing (it gave up). Its pushed
        rows stay in the generation. If nobody can receive the generation any
        more (a barrier lost a member, or this was the last open handle and no
        finish is deferred), return :class:`Orphaned` (once); a deferred
        finisher receives it instead."""
        entry = self._entries.get(bid)
        gen = self._open_generation(bid, worker)
        gen.open.discard(worker)
        assert entry is not None
        if gen.closed or (not entry.description.barrier and gen.open):
            return None
        if gen.deferred is not None:  # a finisher still waits: its rows and ours reach it
            self._hand_to_deferred(bid, gen)
            return None
        gen.closed = True
        return Orphaned(bid, gen.number)

    def abandon(self, bid: BatchId) -> list[Orphaned]:
        """Forget ``bid`` (its attempt was abandoned); return its generations
        that were not handed off. Unknown ids are a no-op."""
        entry = self._entries.pop(bid, None)
        if entry is None:
            return []
        for gen in entry.generations:
            self._release_deferred(bid, gen)
        return [Orphaned(bid, g.number) for g in entry.generations if not g.closed]

    def settled(self, bid: BatchId) -> bool:
        """Whether every one of the ``n_workers`` finished a handle on ``bid``
        and none is open or deferred: no generation of it can start or take
        rows any more (a worker joins an id once, so its finish is final)."""
        entry = self._entries.get(bid)
        if entry is None:
            return False
        finished = set().union(*(g.finished for g in entry.generations))
        return len(finished) == self.n_workers and not any(
            g.open or g.deferred is not None for g in entry.generations
        )

    def sweep(self, keep: Callable[[BatchId], bool]) -> list[BatchId]:
        """Forget every id for which ``keep`` is false, whose generations were
        all handed off or orphaned and hold no open handle; return them. An id with a generation
        still in progress stays whatever ``keep`` says: cleanup never takes a
        batch away from its last finisher (use :meth:`abandon` for that)."""
        done = [
            bid
            for bid, entry in self._entries.items()
            if not keep(bid) and all(g.closed and not g.open for g in entry.generations)
        ]
        for bid in done:
            del self._entries[bid]
        return done

    def _lingers(self, entry: _Entry, gen: _Generation, now: float) -> bool:
        return (
            self.linger_s > 0
            and not entry.description.barrier
            and len(entry.joined) < self.n_workers
            and (gen.deadline is None or now < gen.deadline)
        )

    def _release_deferred(self, bid: BatchId, gen: _Generation) -> None:
        if gen.deferred is not None:
            self._resolved.append(Resolved(bid, gen.deferred, NotLast(gen.number)))
            gen.deferred = None

    def _hand_to_deferred(self, bid: BatchId, gen: _Generation) -> None:
        assert gen.deferred is not None and not gen.open
        gen.closed = True
        decision = Last(gen.number, dict(gen.contributors))
        self._resolved.append(Resolved(bid, gen.deferred, decision))
        gen.deferred = None

    def _open_generation(self, bid: BatchId, worker: int) -> _Generation:
        self._check_worker(worker)
        entry = self._entries.get(bid)
        if entry is not None:
            for gen in reversed(entry.generations):
                if worker in gen.open:
                    return gen
        raise ProtocolError(f"worker {worker} has no open handle on batch id {bid}")

    def _check_worker(self, worker: int) -> None:
        if worker not in self.workers:
            raise ProtocolError(f"worker {worker} is not one of {sorted(self.workers)}")
