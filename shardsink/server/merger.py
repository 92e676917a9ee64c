"""One thread that runs the consensus server's merge passes a step at a time,
in turn.

A pass is a generator (:func:`~shardsink.persist.compaction.merge_steps`)
that yields after each merged window. The server starts at most one pass per
merge lane; the merger steps every running pass once per round, so a small
pass in the 4 MiB lane finishes within a few rounds beside a long one. Three
lane threads had each hold a window's scratch and their allocator's freed
pages at once: merges of 2M, 512K and 32K rows peaked 105-123 MiB above the
process's size in three threads, 55-59 MiB interleaved on one (the three in
a row: 40 MiB).
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from concurrent.futures import Future
from typing import Any

Steps = Generator[None, None, Any]


class MergerClosed(RuntimeError):
    """The merger closed before the pass ended (what it wrote was deleted)."""


class Merger:
    """Runs submitted passes on one daemon thread named ``name``, a step of
    each in turn. :meth:`submit` returns a future of the pass's return value
    (or of the exception it raised; the other passes go on). :meth:`close`
    (idempotent) stops after the step under way and closes every unfinished
    pass, so its cleanup runs (a merge deletes what it wrote); their futures
    fail with :class:`MergerClosed`."""

    def __init__(self, name: str = "shardsink-merge") -> None:
        self._changed = threading.Condition()
        self._incoming: list[tuple[Steps, Future]] = []
        self._running: list[tuple[Steps, Future]] = []
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, steps: Steps) -> Future:
        future: Future = Future()
        with self._changed:
            if self._closing:
                steps.close()
                raise MergerClosed("the merger is closed")
            self._incoming.append((steps, future))
            self._changed.notify()
        return future

    def close(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join()
        with self._changed:
            unfinished, self._incoming = self._running + self._incoming, []
            self._running = []
        for steps, future in unfinished:
            steps.close()
            if not future.done():
                future.set_exception(MergerClosed("the merger closed before the pass ended"))

    def _run(self) -> None:
        while self._take_incoming():
            for item in list(self._running):
                if self._closing:
                    return
                steps, future = item
                try:
                    next(steps)
                except StopIteration as done:
                    self._finish(item)
                    future.set_result(done.value)
                except Exception as exc:
                    self._finish(item)
                    future.set_exception(exc)

    def _take_incoming(self) -> bool:
        """Wait for a pass to run; move the submitted ones in. ``False`` once closing."""
        with self._changed:
            while not (self._incoming or self._running or self._closing):
                self._changed.wait()
            self._running.extend(self._incoming)
            self._incoming.clear()
            return not self._closing

    def _finish(self, item: tuple[Steps, Future]) -> None:
        with self._changed:
            self._running.remove(item)
