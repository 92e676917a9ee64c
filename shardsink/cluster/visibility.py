"""End-to-end latency: from an interval's rows being generated to a
reader seeing them (``up --listen``).

A thread of the coordinator's process listens on the shard as any reader
would (:meth:`~shardsink.persist.reader.Reader.listen`, through a shard
handle of its own, so it never shares the coordinator's socket) and, for
each interval an event covers, records the time from the interval's first
mint (when its workers start generating its rows:
``Counters.minted_at``) to the event: generate to visible, across the
append, the consensus server's reply and the reader's long poll. Both
times are this process's monotonic clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .._histograms import Latencies
from ..persist import PersistError, Shard
from ..storage import StorageError

log = logging.getLogger(__name__)

#: How long one listen waits for an append before it looks at ``stop``.
WAIT_S = 0.5


class VisibilityWatch:
    """Listens from ``since`` on a shard ``open_shard()`` opens, timing each
    interval of ``interval_ms`` against ``minted_at`` (interval -> monotonic
    time of its first mint; consumed as it goes). :meth:`close` (idempotent)
    stops and joins the thread and closes its shard."""

    def __init__(
        self,
        open_shard: Callable[[], Shard],
        since: int,
        interval_ms: int,
        minted_at: dict[int, float],
    ) -> None:
        self.latencies = Latencies()
        self._open, self._since, self._interval_ms = open_shard, since, interval_ms
        self._minted_at = minted_at
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="visibility", daemon=True)
        self._thread.start()

    def snapshot(self) -> Latencies:
        """A copy of what was recorded so far (safe from another thread)."""
        with self._lock:
            copy = Latencies()
            copy.add(self.latencies)
            return copy

    def _run(self) -> None:
        try:
            with self._open() as shard:
                self._listen(shard)
        except (StorageError, PersistError) as exc:  # the run goes on without the figure
            log.warning("end-to-end latency: the listening reader failed: %s", exc)

    def _listen(self, shard: Shard) -> None:
        frontier = self._since
        with shard.reader() as reader:
            while not self._stop.is_set():
                try:
                    for event in reader.listen(frontier, timeout=WAIT_S):
                        self._seen(event.lower, event.upper, time.monotonic())
                        frontier = event.upper
                        if self._stop.is_set():
                            return
                except TimeoutError:
                    continue

    def _seen(self, lower: int, upper: int, now: float) -> None:
        for interval in range(lower // self._interval_ms, upper // self._interval_ms):
            minted = self._minted_at.pop(interval, None)
            if minted is not None:
                with self._lock:
                    self.latencies.record((now - minted) * 1000)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
