"""The ZeroMQ link between the workers of a group and their builder.

The builder binds a ROUTER socket (:class:`PartReceiver`); each worker connects
a DEALER (:class:`PartSender`) and owns an :class:`~shardsink.shm.arena.Arena`.
A worker sends each part either inline (its Arrow IPC bytes in the message) or
as a reference into its arena; the builder reads it, zero-copy for references,
and acknowledges references when it is done with them, which frees their space.
Inline parts need no acknowledgement. Messages of one worker arrive in order,
numbered from 0; a gap is an error, never a silently missing part.

Endpoints are ``ipc://`` in a directory private to this user
(:func:`_endpoint`): the channel's parts are in this host's shared memory, so
it never crosses hosts, and its socket needs no key. Each sender and receiver
creates its own ZeroMQ context, so create them after any fork.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

import msgspec
import pyarrow as pa
import zmq

from .._address import check_address
from .arena import DEFAULT_CAPACITY, DEFAULT_SEGMENT_SIZE, Arena, size_bound, write_stream
from .errors import ShmError, TransportError, TransportTimeout
from .messages import (
    Ack,
    Error,
    MessagePart,
    Metadata,
    Part,
    PartRef,
    Retire,
    decode_to_builder,
    decode_to_worker,
    encode,
)
from .segments import SegmentReader, decode_part

_log = logging.getLogger(__name__)


def _endpoint(endpoint: str, *, for_bind: bool) -> str:
    """``endpoint`` if it is a private ``ipc://`` address
    (:func:`~shardsink._address.check_address`), else ``ValueError``."""
    if not endpoint.startswith("ipc://"):
        raise ValueError(
            f"part channel endpoint {endpoint!r}: the channel is host-local (its parts are in "
            "shared memory), so it takes ipc:// endpoints only"
        )
    return check_address(endpoint, for_bind=for_bind)


# Parts up to this many bytes (arena.size_bound of the batch) travel inline.
# Measured with `shardsink bench transport --inline-sweep` (worker and builder
# processes, the reader touching every byte; the figures are in
# docs/benchmarks.md, "Transport"): two early runs, pair after pair, had
# inline win up to 32 KiB; a side-by-side run puts the crossover between 4
# and 16 KiB. An inline part also spares the builder an acknowledgement and
# the worker arena space, which that benchmark does not weigh: the cut-off
# stays until a cluster run compares 8 and 32 KiB.
MESSAGE_PART_MAX_BYTES = 32 << 10
DEFAULT_TIMEOUT = 30.0
# Plain ints: pyzmq's constants are enum members, and combining them costs more
# than the call they are passed to (2.4 us of 4.8 us per state check here).
_EVENTS, _POLLIN, _NOBLOCK, _SNDMORE, _RCVMORE = (
    int(zmq.EVENTS),
    int(zmq.POLLIN),
    int(zmq.NOBLOCK),
    int(zmq.SNDMORE),
    int(zmq.RCVMORE),
)


def _wait(sock: zmq.Socket, timeout_ms: int) -> bool:
    """Whether ``sock`` has a message within ``timeout_ms`` (-1: no limit);
    ``Socket.poll`` would build a ``Poller`` for every call."""
    return bool(zmq.zmq_poll([(sock, _POLLIN)], timeout_ms))


class PartSender:
    """Worker side: writes parts into its own arena and sends them to the builder.

    ``timeout`` (seconds) bounds every wait for the builder: for room in a full
    arena, for a full send queue, in :meth:`wait_acked`; exceeding it raises
    :class:`TransportTimeout` naming the builder's endpoint. An error reply
    from the builder raises :class:`TransportError` from the next call, and
    from every call after it. ``identity``, if given, is the socket's ZeroMQ
    routing id, so the builder sees it as :attr:`Received.sender` and can hold
    a part's metadata to it; it must be unique among the receiver's senders.
    Not thread-safe; :meth:`close` is idempotent.
    """

    def __init__(
        self,
        endpoint: str,
        cluster: str,
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        capacity: int = DEFAULT_CAPACITY,
        message_part_max_bytes: int = MESSAGE_PART_MAX_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
        identity: bytes | None = None,
    ) -> None:
        self.endpoint = _endpoint(endpoint, for_bind=False)
        self.message_part_max_bytes = message_part_max_bytes
        self.timeout = timeout
        self.arena = Arena(cluster, segment_size=segment_size, capacity=capacity)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        # Acknowledgements are bounded by the arena; a full queue must never drop one.
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
        self._sock.setsockopt(zmq.LINGER, 200)
        if identity is not None:
            self._sock.setsockopt(zmq.IDENTITY, identity)
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self._sock.close()
            self._ctx.term()
            raise ValueError(f"cannot connect to {endpoint!r}: {exc}") from None
        self._seq = 0
        self._failure: ShmError | None = None
        self._closed = False

    def send(self, batch: pa.RecordBatch, meta: Metadata | None = None) -> int:
        """Send ``batch`` (with optional small ``meta``) to the builder and return
        its sequence number. Blocks while the arena is full."""
        self._check()
        self._drain(0)
        bound = size_bound(batch)
        seq = self._seq
        msg: Part | MessagePart
        if bound <= self.message_part_max_bytes:
            sink = pa.BufferOutputStream()
            write_stream(sink, batch)
            msg = MessagePart(seq, memoryview(sink.getvalue()), meta or {})
        else:
            msg = Part(seq, self._write(batch, bound), meta or {})
        self._post(msg)
        self._seq += 1
        retired = self.arena.take_retired()
        if retired:
            self._post(Retire(retired))
        return seq

    def wait_acked(self, timeout: float | None = None) -> None:
        """Wait until the builder has acknowledged every part sent so far."""
        self._check()
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while self.arena.outstanding:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._stalled(timeout)
            self._drain(remaining)

    def close(self) -> None:
        """Unlink the arena, tell the builder, close the socket; idempotent.
        Parts not yet acknowledged are abandoned."""
        if self._closed:
            return
        self._closed = True
        try:
            self.arena.close()
            retired = self.arena.take_retired()
            if retired:
                # A builder not taking messages unmaps when it exits.
                with contextlib.suppress(zmq.Again):
                    self._sock.send(encode(Retire(retired)), zmq.NOBLOCK)
        finally:
            self._sock.close()
            self._ctx.term()

    def __enter__(self) -> PartSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise ValueError("part sender is closed")
        if self._failure is not None:
            raise self._failure

    def _write(self, batch: pa.RecordBatch, bound: int) -> PartRef:
        deadline = time.monotonic() + self.timeout
        while (ref := self.arena.try_write(batch, bound)) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._stalled(self.timeout)
            self._drain(remaining)
        return ref

    def _stalled(self, waited: float) -> TransportTimeout:
        return TransportTimeout(
            f"builder at {self.endpoint} did not acknowledge {self.arena.outstanding} parts "
            f"({self.arena.outstanding_bytes} bytes of an arena of {self.arena.capacity}) "
            f"within {waited:g}s"
        )

    def _post(self, msg: Part | MessagePart | Retire) -> None:
        try:
            self._sock.send(encode(msg))
        except zmq.Again:
            self._failure = TransportTimeout(
                f"builder at {self.endpoint} did not take messages for {self.timeout:g}s"
            )
            raise self._failure from None

    def _drain(self, timeout: float) -> None:
        """Handle every message from the builder, waiting up to ``timeout`` s for one."""
        sock = self._sock
        if timeout > 0:
            if not _wait(sock, max(0, int(timeout * 1000))):
                return
        elif not sock.getsockopt(_EVENTS) & _POLLIN:
            # Called before every part: reading the socket's state costs about
            # half a poll (no Poller object, no wait).
            return
        while True:
            try:
                raw = sock.recv(_NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = decode_to_worker(raw)
            except msgspec.DecodeError as exc:
                self._failure = TransportError(
                    f"undecodable message from the builder at {self.endpoint}: {exc}"
                )
                raise self._failure from None
            if isinstance(msg, Error):
                self._failure = TransportError(
                    f"builder at {self.endpoint} rejected message {msg.seq}: {msg.reason}"
                )
                raise self._failure
            release = self.arena.release
            for ref in msg.refs:
                try:
                    release(ref)
                except ValueError as exc:
                    self._failure = TransportError(
                        f"builder at {self.endpoint} acknowledged a part not sent: {exc}"
                    )
                    raise self._failure from None
            if not sock.getsockopt(_EVENTS) & _POLLIN:
                return  # cheaper than a receive that raises zmq.Again


def _where(msg: Part | MessagePart, sender: bytes) -> str:
    return f"message {msg.seq} from sender {sender.hex()}"


@dataclass(frozen=True, slots=True)
class Received:
    """A part as the builder receives it. ``sender`` is the sending socket's
    ZeroMQ routing id. ``ref`` is ``None`` for an inline part; otherwise
    ``batch`` points into the sender's arena until acknowledged."""

    sender: bytes
    seq: int
    batch: pa.RecordBatch
    meta: Metadata
    ref: PartRef | None


class PartReceiver:
    """Builder side: binds ``endpoint`` and receives the parts of its workers.

    ``creators`` (worker pids) and ``schema``, if given, restrict what is
    accepted; see :class:`~shardsink.shm.segments.SegmentReader`. A message that
    cannot be decoded gets an error reply and a log line and is skipped. A part
    that cannot be read, or that arrives out of order, gets an error reply and
    raises (:class:`~shardsink.shm.errors.ShmError`): the interval cannot be
    completed honestly. Not thread-safe; :meth:`close` is idempotent.
    """

    def __init__(
        self,
        endpoint: str,
        cluster: str,
        *,
        creators: Collection[int] | None = None,
        schema: pa.Schema | None = None,
        full_validation: bool = False,
    ) -> None:
        _endpoint(endpoint, for_bind=True)
        self.reader = SegmentReader(cluster, creators=creators, full_validation=full_validation)
        self.schema = schema
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        # A ROUTER drops what exceeds its send queue; acknowledgements (bounded by
        # the senders' arenas) must never be dropped.
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self._sock.close()
            self._ctx.term()
            raise ValueError(f"cannot bind {endpoint!r}: {exc}") from None
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._next_seq: dict[bytes, int] = {}
        self._closed = False

    def recv(self, timeout: float | None = None) -> Received | None:
        """The next part from any worker, or ``None`` after ``timeout`` seconds
        (``None``: wait indefinitely)."""
        if self._closed:
            raise ValueError("part receiver is closed")
        sock = self._sock
        deadline = None
        while True:
            # A streaming worker usually has the next message queued already:
            # check the socket's state before paying for a poll.
            if not sock.getsockopt(_EVENTS) & _POLLIN:
                if timeout is not None and timeout <= 0:
                    return None  # the socket's state is all a poll would tell
                if deadline is None and timeout is not None:
                    deadline = time.monotonic() + timeout
                wait = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
                if not _wait(sock, wait):
                    return None
            frames = [sock.recv()]
            while sock.getsockopt(_RCVMORE):
                frames.append(sock.recv())
            if len(frames) != 2:
                self._reject(frames[0], f"expected one message frame, got {len(frames) - 1}")
                continue
            received = self._handle(*frames)
            if received is not None:
                return received

    @property
    def socket(self) -> zmq.Socket:
        """The bound socket, to poll alongside others (then :meth:`recv` with
        timeout 0); receive only through :meth:`recv`."""
        return self._sock

    def ack(self, *parts: Received) -> None:
        """Tell each sender that the builder is done with these parts: their
        batches must not be used afterwards. Inline parts are skipped."""
        refs: dict[bytes, list[PartRef]] = {}
        for part in parts:
            if part.ref is not None:
                refs.setdefault(part.sender, []).append(part.ref)
        for sender, sender_refs in refs.items():
            self._sock.send(sender, _SNDMORE)
            self._sock.send(encode(Ack(sender_refs)))

    def close(self) -> None:
        """Close the socket and drop every mapping; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.reader.close()
        self._sock.close()
        self._ctx.term()

    def __enter__(self) -> PartReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, sender: bytes, raw: bytes) -> Received | None:
        try:
            msg = decode_to_builder(raw)
        except msgspec.DecodeError as exc:
            self._reject(sender, f"undecodable message: {exc}")
            return None
        if isinstance(msg, Retire):
            self.reader.forget(msg.segments)
            return None
        expected = self._next_seq.get(sender, 0)
        ref = msg.ref if isinstance(msg, Part) else None
        try:
            if msg.seq != expected:
                raise TransportError(
                    f"{_where(msg, sender)} arrived when {expected} was due: parts were lost"
                )
            self._next_seq[sender] = expected + 1
            if ref is not None:
                batch = self.reader.read(ref, self.schema)
            else:
                batch = decode_part(
                    pa.py_buffer(msg.data),
                    lambda: f"inline part ({_where(msg, sender)})",
                    schema=self.schema,
                    full_validation=self.reader.full_validation,
                )
        except ShmError as exc:
            self._sock.send_multipart([sender, encode(Error(msg.seq, str(exc)))])
            raise
        return Received(sender, msg.seq, batch, msg.meta, ref)

    def _reject(self, sender: bytes, reason: str) -> None:
        _log.warning("rejected a message from sender %s: %s", sender.hex(), reason)
        self._sock.send_multipart([sender, encode(Error(None, reason))])
