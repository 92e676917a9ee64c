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

from collections.abc import Callable
from dataclasses import dataclass, field

BatchId = tuple[int, int]
"""(interval, attempt); the builder's group, cluster and shard are fixed."""


@dataclass(frozen=True)
class Description:
    """What a batch id describes: the interval ``[lower, upper)`` and its mode."""

    lower: int
    upper: int
    barrier: bool


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


@dataclass
class _Entry:
    description: Description
    generations: list[_Generation]

    @property
    def current(self) -> _Generation:
        return self.generations[-1]


class SharedBatches:
    """The shared batches of one group with ``n_workers`` workers (see module doc)."""

    def __init__(self, n_workers: int) -> None:
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self.n_workers = n_workers
        self._entries: dict[BatchId, _Entry] = {}

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
        return gen.number

    def push(self, bid: BatchId, worker: int, rows: int) -> int:
        """Record that ``worker`` added ``rows`` rows through its open handle;
        return the generation they went to."""
        if rows < 0:
            raise ProtocolError(f"worker {worker} pushed {rows} rows")
        gen = self._open_generation(bid, worker)
        if rows:
            gen.contributors[worker] = gen.contributors.get(worker, 0) + rows
        return gen.number

    def finish(self, bid: BatchId, worker: int) -> NotLast | Last:
        """Close ``worker``'s handle. :class:`Last` for the finisher that
        receives the generation, :class:`NotLast` for every other."""
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
        gen.closed = True
        return Last(gen.number, dict(gen.contributors))

    def drop(self, bid: BatchId, worker: int) -> Orphaned | None:
        """Close ``worker``'s handle without finishing (it gave up). Its pushed
        rows stay in the generation. If nobody can receive the generation any
        more (a barrier lost a member, or this was the last open handle),
        return :class:`Orphaned` (once)."""
        entry = self._entries.get(bid)
        gen = self._open_generation(bid, worker)
        gen.open.discard(worker)
        assert entry is not None
        if gen.closed or (not entry.description.barrier and gen.open):
            return None
        gen.closed = True
        return Orphaned(bid, gen.number)

    def abandon(self, bid: BatchId) -> list[Orphaned]:
        """Forget ``bid`` (its attempt was abandoned); return its generations
        that were not handed off. Unknown ids are a no-op."""
        entry = self._entries.pop(bid, None)
        if entry is None:
            return []
        return [Orphaned(bid, g.number) for g in entry.generations if not g.closed]

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

    def _open_generation(self, bid: BatchId, worker: int) -> _Generation:
        self._check_worker(worker)
        entry = self._entries.get(bid)
        if entry is not None:
            for gen in reversed(entry.generations):
                if worker in gen.open:
                    return gen
        raise ProtocolError(f"worker {worker} has no open handle on batch id {bid}")

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.n_workers:
            raise ProtocolError(f"worker {worker} is not in [0, {self.n_workers})")
