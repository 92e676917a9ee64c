"""Waiting in a test for what cannot tell the test it happened (a file another
process writes, a server's state, a process's exit): :func:`wait_until` polls
a predicate with a short backoff and fails the test naming what it waited
for. Where the thing waited for can signal (a ``threading.Event``, a line a
child prints), a test waits on that signal instead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: The first pause between two polls; each pause doubles up to ``every_s``.
FIRST_PAUSE_S = 0.005


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str | Callable[[], str],
    *,
    every_s: float = 0.1,
) -> T:
    """The first truthy value of ``predicate()``, polled until ``timeout_s``
    has passed, with pauses from :data:`FIRST_PAUSE_S` doubling up to
    ``every_s`` (a test that samples something short-lived passes a short
    one). On timeout raises ``AssertionError("WHAT not within TIMEOUT s")``;
    ``what`` may be a callable, evaluated only then (for details known only
    at the end). The predicate may itself assert (a child must still run);
    its last call comes at the deadline (the last pause ends there)."""
    deadline = time.monotonic() + timeout_s
    pause = min(FIRST_PAUSE_S, every_s)
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            described = what() if callable(what) else what
            raise AssertionError(f"{described} not within {timeout_s} s")
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, every_s)
