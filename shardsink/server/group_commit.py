"""Group commit in the consensus server: what the request loop holds between
receiving shard commands and storing their versions in one
``compare_and_set_many``.

:class:`CommandQueue` holds the received commands per shard, oldest first; a
batch takes the oldest of each shard, so a batch has at most one command per
shard and a shard's commands keep their order. :class:`BatchWindow` is how
long the loop gathers more requests before it commits, as FoundationDB's
commit batching does: a fraction of the observed commit latency, bounded by
the server's ``batch_window_max_ms``, starting small after an idle spell
and shrinking again while batches hold a single command (one client alone
never waits for company). Both are plain state without I/O, the time given
by the caller. :class:`OwnCommands` hands the server's own commands (the
merge lanes' compactions) to the loop, so they are stored in its batches
rather than in a transaction (and an fsync) of their own each.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future

import msgspec

from ..persist import Command, Result
from ..storage import StorageError

#: The share of the smoothed commit latency the window takes: while one
#: batch is being stored, the next gathers, so waiting about half a commit
#: more lets the clients that were just answered join the next batch.
WINDOW_FRACTION = 0.5
#: The first window after an idle spell; each busy batch at most doubles it.
WINDOW_START_S = 0.000_05
#: The weight of the newest commit in the smoothed latency.
LATENCY_WEIGHT = 0.2


class Queued(msgspec.Struct, frozen=True):
    """A received command waiting for its batch: who asked (``peer``,
    ``request_id``), the shard, the command, when it arrived (monotonic
    seconds)."""

    peer: bytes
    request_id: bytes
    shard: str
    command: Command
    received: float


class CommandQueue:
    """Received commands per shard, in arrival order."""

    def __init__(self) -> None:
        self._shards: dict[str, deque[Queued]] = {}

    def __len__(self) -> int:
        """How many shards have a command waiting (the size of the next batch)."""
        return len(self._shards)

    def put(self, item: Queued) -> None:
        self._shards.setdefault(item.shard, deque()).append(item)

    def take(self, most: int) -> list[Queued]:
        """The oldest command of each of at most ``most`` shards (the shards
        waiting longest first), removed from the queue."""
        batch = []
        for shard in list(self._shards)[:most]:
            waiting = self._shards.pop(shard)
            batch.append(waiting.popleft())
            if waiting:  # to the back: the shards behind it go first next time
                self._shards[shard] = waiting
        return batch


class BatchWindow:
    """The seconds to gather requests before the next group commit
    (:attr:`seconds`), from the commits seen (:meth:`committed`), at most
    ``max_s`` (0: never wait, commit what is queued)."""

    def __init__(self, max_s: float) -> None:
        if max_s < 0:
            raise ValueError(f"batch window must be >= 0 seconds, got {max_s}")
        self.max_s = max_s
        self.seconds = 0.0
        #: smoothed seconds one ``compare_and_set_many`` took
        self.latency_s = 0.0

    def committed(self, size: int, latency_s: float) -> None:
        """A batch of ``size`` commands took ``latency_s`` to store: several
        (clients are concurrent) grow the window toward its share of the
        latency, one alone halves it."""
        if self.latency_s == 0.0:
            self.latency_s = latency_s
        else:
            self.latency_s += LATENCY_WEIGHT * (latency_s - self.latency_s)
        if size > 1:
            grown = max(2 * self.seconds, WINDOW_START_S)
            self.seconds = min(grown, WINDOW_FRACTION * self.latency_s, self.max_s)
        else:
            self.seconds = 0.0 if self.seconds < 2 * WINDOW_START_S else self.seconds / 2

    def idle(self) -> None:
        """Nothing arrived for a poll: the next batch starts small."""
        self.seconds = 0.0


#: The ``peer`` of a command of the server's own (a ROUTER peer is never empty).
OWN = b""


class OwnCommands:
    """Commands of the server's own threads for the request loop's group
    commit. :meth:`submit` (any thread) queues one and waits for its result;
    the loop takes them (:meth:`take`) into its :class:`CommandQueue` and
    answers them (:meth:`answer`, :meth:`fail`). Once closed (:meth:`close`,
    when the loop has stopped), what waits fails and :meth:`submit` fails at
    once, so a merge lane never waits for a loop that is gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new: list[Queued] = []
        self._waiting: dict[bytes, Future] = {}
        self._closed = False

    def submit(self, shard: str, command: Command, timeout_s: float = 60.0) -> Result:
        """``command``'s result once the loop has stored it; ``StorageError``
        if the server closes first, ``TimeoutError`` past ``timeout_s``."""
        future: Future = Future()
        token = uuid.uuid4().bytes
        with self._lock:
            if self._closed:
                raise StorageError("the consensus server is closing")
            self._waiting[token] = future
            self._new.append(Queued(OWN, token, shard, command, time.monotonic()))
        return future.result(timeout=timeout_s)

    def take(self) -> list[Queued]:
        """The commands submitted since the last call, oldest first."""
        with self._lock:
            new, self._new = self._new, []
        return new

    def answer(self, item: Queued, result: Result) -> None:
        with self._lock:
            future = self._waiting.pop(item.request_id, None)
        if future is not None:
            future.set_result(result)

    def fail(self, item: Queued, exc: BaseException) -> None:
        with self._lock:
            future = self._waiting.pop(item.request_id, None)
        if future is not None:
            future.set_exception(exc)

    def close(self) -> None:
        """Fail what waits and refuse what comes. Idempotent."""
        with self._lock:
            self._closed = True
            waiting, self._waiting, self._new = self._waiting, {}, []
        for future in waiting.values():
            future.set_exception(StorageError("the consensus server is closing"))
