"""A child's word to its parent that it is ready: one typed message on a pipe.

A :class:`~.child.Launch` with ``stdout="pipe"`` gives the parent the read
end of the child's stdout, whichever starter ran it. The child takes that
pipe over as its channel (:class:`ParentChannel`): it keeps a descriptor of
its own on it and points its stdout at its stderr (its log), so nothing it or
a library prints can be taken for the message. It writes one message, a
4-byte big-endian length and its msgpack body, and closes the channel; the
parent reads it (:func:`wait_ready`), or learns why none came.
"""

from __future__ import annotations

import os
import selectors
import struct
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec

from .child import Child

T = TypeVar("T")

_LENGTH = struct.Struct(">I")
#: Largest message the parent takes: a readiness word is a few addresses.
MAX_MESSAGE = 1 << 16

encode = msgspec.msgpack.Encoder().encode


class NotReady(Exception):
    """No readiness message came; the message says why (the child exited
    with its status, it timed out, or it sent something unreadable)."""


class ParentChannel:
    """The child's side: its stdout pipe, taken over when made (see the
    module doc)."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self._fd: int | None = os.dup(1)
        os.dup2(2, 1)

    def tell(self, message: msgspec.Struct) -> None:
        """Send ``message`` and close the channel (once: a later call is a
        ``RuntimeError``)."""
        if self._fd is None:
            raise RuntimeError("the parent was told already")
        body = encode(message)
        data = memoryview(_LENGTH.pack(len(body)) + body)
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        finally:
            os.close(self._fd)
            self._fd = None


def wait_ready(child: Child, decode: Callable[[bytes], T], timeout_s: float) -> T:
    """The message ``child`` (started with ``stdout="pipe"``) sends, decoded
    with ``decode``, within ``timeout_s``; :class:`NotReady` saying why not."""
    proc = child.proc
    assert proc is not None and proc.stdout is not None, "start it with stdout='pipe'"
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        (length,) = _LENGTH.unpack(_read(child, fd, _LENGTH.size, selector, deadline, timeout_s))
        if length > MAX_MESSAGE:
            raise NotReady(f"it sent a message of {length} bytes, over {MAX_MESSAGE}")
        body = _read(child, fd, length, selector, deadline, timeout_s)
    try:
        return decode(body)
    except msgspec.DecodeError as exc:
        raise NotReady(f"it sent an unreadable message: {exc}") from None


def _read(
    child: Child,
    fd: int,
    size: int,
    selector: selectors.BaseSelector,
    deadline: float,
    timeout_s: float,
) -> bytes:
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0 or not selector.select(left):
            raise NotReady(f"it was not ready within {timeout_s:g} s")
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise NotReady(_gone(child))
        data += chunk
    return data


def _gone(child: Child) -> str:
    """Why the channel closed before the message: its exit status, if it
    exits soon (a closed channel is mostly a child that exited)."""
    status = child.wait(1.0)
    if status is None:
        return "it closed its channel before it was ready"
    return f"it exited with status {status} before it was ready"
