"""What a peer's driver and its worker processes say to each other, and
how: length-prefixed msgpack frames of :class:`~shardsink._wire.Message`
unions over the worker's stdin (driver to worker) and stdout (worker to
driver). Nothing is pickled: an interval's rows cross as Arrow IPC bytes.

Driver to worker: :class:`Go` (write interval ``i``); the end of its
stdin tells a worker to stop.
Worker to driver: :class:`Ready` once, then per interval one of
:class:`Committed` (it committed its slice itself), :class:`Handed` (its
slice's rows, for the coalesced committer) or :class:`Written` (the
Parquet file it wrote into the table, for the driver to commit).
"""

from __future__ import annotations

import os
import select
import struct
import time
from typing import BinaryIO

import msgspec

from ..._wire import Message

#: A frame: its length (4 bytes, big-endian), then the message.
_LENGTH = struct.Struct(">I")


class Go(Message, tag="go"):
    interval: int


class Ready(Message, tag="ready"):
    pass


class Outcome(Message, tag="outcome"):
    """One commit's outcome: the library's retries where it reports them
    per commit (pyiceberg), and the error of a commit that failed
    (``""``: it committed)."""

    retries: int = 0
    error: str = ""


class Committed(Message, tag="committed"):
    interval: int
    rows: int
    outcome: Outcome


class Handed(Message, tag="handed"):
    interval: int
    rows: int
    #: the slice as an Arrow IPC stream
    ipc: bytes


class FileRef(Message, tag="file"):
    """A data file written into a table, not committed yet: its path
    relative to the table, its size, and its statistics as the format
    records them (JSON)."""

    path: str
    size: int
    stats: str


class Written(Message, tag="written"):
    interval: int
    rows: int
    #: ``None`` for an empty slice: nothing written
    file: FileRef | None


FromWorker = Ready | Committed | Handed | Written

encode = msgspec.msgpack.Encoder().encode
decode_to_worker = msgspec.msgpack.Decoder(Go).decode
decode_from_worker = msgspec.msgpack.Decoder(FromWorker).decode


def send(stream: BinaryIO, message: Message) -> None:
    """Write ``message`` as one frame and flush it."""
    body = encode(message)
    stream.write(_LENGTH.pack(len(body)) + body)
    stream.flush()


def receive_blocking(stream: BinaryIO) -> Go | None:
    """The next frame to a worker from ``stream``; ``None`` at its end (the
    driver is gone)."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (n,) = _LENGTH.unpack(head)
    return decode_to_worker(stream.read(n))


def receive(fd: int, deadline: float, who: str) -> FromWorker:
    """The next frame from a worker on ``fd`` by ``deadline`` (monotonic);
    ``RuntimeError`` naming ``who`` if it ends or does not come in time."""
    (n,) = _LENGTH.unpack(_read_exact(fd, _LENGTH.size, deadline, who))
    return decode_from_worker(_read_exact(fd, n, deadline, who))


def _read_exact(fd: int, n: int, deadline: float, who: str) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fd], [], [], wait)[0]:
            raise RuntimeError(f"{who} did not answer in time")
        chunk = os.read(fd, left)
        if not chunk:
            raise RuntimeError(f"{who} exited; see its error above")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
