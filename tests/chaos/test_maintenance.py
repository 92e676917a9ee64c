"""The chaos run's maintenance thread: a GC still running when the run stops
is given a short grace, then ended, so that it does not hold the stop."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from shardsink.chaos import clients


class _Hung:
    """A GC child that never exits."""

    def wait(self, timeout_s: float) -> int | None:
        time.sleep(timeout_s)  # as a child's wait does when the child runs on
        return None


class _Exits:
    def __init__(self, after_s: float) -> None:
        self.at = time.monotonic() + after_s

    def wait(self, timeout_s: float) -> int | None:
        # as a child's wait does: until it exits, or the timeout
        time.sleep(max(0.0, min(timeout_s, self.at - time.monotonic())))
        return 0 if time.monotonic() >= self.at else None


def test_a_gc_held_up_when_the_run_stops_is_ended_after_the_grace(monkeypatch):
    monkeypatch.setattr(clients, "STOP_GRACE_S", 0.5)
    run = SimpleNamespace(stop=threading.Event())
    threading.Timer(0.3, run.stop.set).start()
    started = time.monotonic()
    assert clients._wait_gc(run, _Hung()) is None
    assert 0.7 <= time.monotonic() - started < 2.0  # not MAINTENANCE_TIMEOUT_S


def test_a_gc_that_finishes_within_the_grace_is_waited_for(monkeypatch):
    monkeypatch.setattr(clients, "STOP_GRACE_S", 2.0)
    run = SimpleNamespace(stop=threading.Event())
    run.stop.set()
    assert clients._wait_gc(run, _Exits(0.5)) == 0
