"""The consensus server's merge thread (``server.merger``): passes run a step
at a time in turn; a failing pass fails alone; closing ends the unfinished."""

from __future__ import annotations

import threading

import pytest

from shardsink.server.merger import Merger, MergerClosed


def _pass(name: str, steps: int, log: list[str], gate: threading.Event | None = None):
    for step in range(steps):
        log.append(f"{name}{step}")
        yield
        if gate is not None:
            gate.wait(10)
    return name


def test_passes_interleave_a_step_at_a_time_and_return_their_values() -> None:
    log: list[str] = []
    gate = threading.Event()
    merger = Merger()
    try:
        # the first pass waits on its first step until both are in
        long = merger.submit(_pass("a", 4, log, gate))
        short = merger.submit(_pass("b", 2, log))
        gate.set()
        assert (long.result(10), short.result(10)) == ("a", "b")
    finally:
        merger.close()
    assert log.index("b1") < log.index("a3")  # the short one did not wait for the long one
    assert sorted(log) == ["a0", "a1", "a2", "a3", "b0", "b1"]


def test_a_failing_pass_fails_alone() -> None:
    def failing():
        yield
        raise ValueError("corrupt part")

    merger = Merger()
    try:
        bad = merger.submit(failing())
        good = merger.submit(_pass("g", 3, []))
        with pytest.raises(ValueError, match="corrupt part"):
            bad.result(10)
        assert good.result(10) == "g"
    finally:
        merger.close()


def test_close_ends_unfinished_passes_and_is_idempotent() -> None:
    cleaned = threading.Event()
    started = threading.Event()

    def endless():
        try:
            while True:
                started.set()
                yield
        finally:
            cleaned.set()

    merger = Merger()
    future = merger.submit(endless())
    assert started.wait(10)
    merger.close()
    merger.close()
    assert cleaned.is_set()
    with pytest.raises(MergerClosed):
        future.result(0)
    assert not any(t.name == "shardsink-merge" for t in threading.enumerate())
    with pytest.raises(MergerClosed):
        merger.submit(_pass("late", 1, []))
