"""Request/reply plumbing over ZeroMQ: a ROUTER server and DEALER clients.

A request is one frame, ``id + payload``: ``id`` an 8-byte big-endian request
number chosen by the client, ``payload`` an opaque msgspec message that the
layer above decodes strictly. A reply is one frame too and starts with the
request's id. Clients match replies by id, so a late reply to a request that
already timed out is discarded instead of being taken for the answer to a
newer one. Why one frame, not two: pyzmq lets go of the GIL for every frame
it sends or receives, and in a process of many writer threads, or a server
beside its merge threads, each let-go hands the GIL to another thread and
waits to get it back.

A ``tcp://`` server is a CURVE server (:mod:`shardsink._curve`): it
encrypts and answers only clients whose public key it accepts; a ``tcp://``
client needs the keys. ``ipc://`` sockets are protected by their 0700
directory instead.

Nothing here unpickles or evaluates anything; payloads are bytes.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from .._address import check_address
from .._curve import ClientKeys, CurveServer, ServerKeys, needs_keys, secure_client
from ..storage import DeterminateError, IndeterminateError

_ID_BYTES = 8
#: Send flags as plain ints: ``send_multipart`` combines pyzmq's flag enums
#: per frame, and a reply's three frames cost 2.8 us that way against 0.8
#: sent one by one with these (by hand); a server sends thousands a second.
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_RCVTIMEO = int(zmq.RCVTIMEO)
#: A call that may wait longer than this for its reply watches its
#: connection: a request sent to a server that then goes away (killed, or
#: restarted at the same address) is lost with it, and waiting out the whole
#: timeout (a maintenance job's is ten minutes) only delays the retry. A
#: shorter call (an append's, seconds) skips the watch, a second socket to
#: poll on the hot path.
WATCH_AFTER_S = 10.0


class RpcServer:
    """The server side: a ROUTER socket bound to one address; a ``tcp://``
    one needs ``keys`` (``ValueError`` without: it would answer anyone).

    ``receive`` yields well-formed requests; a request that is not one frame
    of an id and more is counted in ``dropped`` and not answered (there is no
    id to answer).
    """

    def __init__(
        self, addr: str, ctx: zmq.Context | None = None, keys: ServerKeys | None = None
    ) -> None:
        check_address(addr, for_bind=True, curve=True)  # tcp:// needs keys, below
        if needs_keys(addr) and keys is None:
            raise ValueError(
                f"binding {addr!r} needs CURVE keys, so that only clients with the key are "
                "answered: serve a data dir (its keys/ holds them) or name a key directory"
            )
        self._ctx = ctx or zmq.Context()
        self._own_ctx = ctx is None
        self._curve = CurveServer(self._ctx, keys) if needs_keys(addr) and keys else None
        self._sock = self._ctx.socket(zmq.ROUTER)
        if self._curve is not None:
            self._curve.secure(self._sock)
        self._sock.setsockopt(zmq.LINGER, 0)
        # A client that went away must not block replies to the others.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if addr.startswith("tcp://") and addr.endswith(":0"):
            addr = addr[:-2] + ":*"
        self._sock.bind(addr)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.dropped = 0
        self._closed = False

    @property
    def socket(self) -> zmq.Socket:
        """The ROUTER socket, for use in a ``zmq.Poller`` next to other sockets."""
        return self._sock

    def receive(self, timeout_ms: int) -> list[tuple[bytes, bytes, bytes]]:
        """Wait up to ``timeout_ms`` for requests; return all that are queued as
        ``(peer, id, payload)``."""
        out: list[tuple[bytes, bytes, bytes]] = []
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            return out
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return out
            if len(frames) != 2 or len(frames[1]) < _ID_BYTES:
                self.dropped += 1
                continue
            peer, body = frames
            out.append((peer, body[:_ID_BYTES], body[_ID_BYTES:]))

    def reply(self, peer: bytes, request_id: bytes, payload: bytes) -> None:
        """Send ``payload`` as the answer to request ``request_id`` of ``peer``."""
        # If the peer's queue is full or it is gone, it times out and retries.
        send = self._sock.send
        with contextlib.suppress(zmq.Again):
            send(peer, _MORE_NOBLOCK)
            send(request_id + payload, _NOBLOCK)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sock.close(linger=0)
        if self._curve is not None:
            self._curve.close()
        if self._own_ctx:
            self._ctx.term()


class RpcClient:
    """The client side: DEALER sockets to one server, safe to share across threads.

    Each thread gets its own socket (ZeroMQ sockets are not thread-safe), so a
    long poll in one thread never delays another thread's requests.
    ``call`` sends a request and waits for its reply. A reply that does not come
    within the timeout raises ``IndeterminateError`` (the server may have acted on
    the request); that thread's socket is then recreated so nothing stale is
    queued. ZeroMQ reconnects by itself when a restarted server binds again.
    A call that may wait more than :data:`WATCH_AFTER_S` also raises
    ``IndeterminateError`` as soon as its connection drops while it waits.
    A ``tcp://`` server needs ``keys`` (``ValueError`` without).
    """

    def __init__(self, addr: str, timeout_s: float = 10.0, keys: ClientKeys | None = None) -> None:
        check_address(addr, for_bind=False)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if needs_keys(addr) and keys is None:
            raise ValueError(f"{addr} is a tcp:// server, which answers only CURVE clients")
        self.keys = keys
        self.address = addr
        self.timeout_s = timeout_s
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._local = threading.local()
        self._sockets: set[zmq.Socket] = set()
        self._monitors: dict[zmq.Socket, zmq.Socket] = {}  # by the socket they watch
        self._closed = False

    def _socket(self) -> zmq.Socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            with self._lock:
                if self._closed:
                    raise DeterminateError(f"client of {self.address} is closed")
                sock = self._ctx.socket(zmq.DEALER)
                if self.keys is not None:
                    secure_client(sock, self.keys)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RECONNECT_IVL, 20)
                sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
                sock.connect(self.address)
                self._sockets.add(sock)
            self._local.sock = sock
        return sock

    def _monitor(self, sock: zmq.Socket) -> zmq.Socket:
        """The socket on which ``sock``'s disconnections are told, emptied of
        those told before now."""
        with self._lock:
            monitor = self._monitors.get(sock)
            if monitor is None:
                monitor = self._monitors[sock] = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        while monitor.poll(0, zmq.POLLIN):
            recv_monitor_message(monitor)
        return monitor

    def _reset(self) -> None:
        sock = getattr(self._local, "sock", None)
        if sock is not None:
            self._local.sock = None
            with self._lock:
                self._sockets.discard(sock)
                self._close(sock)

    def _close(self, sock: zmq.Socket) -> None:
        monitor = self._monitors.pop(sock, None)
        if monitor is not None:
            sock.disable_monitor()
            monitor.close(linger=0)
        sock.close(linger=0)

    def call(self, payload: bytes, timeout_s: float | None = None) -> bytes:
        """Send ``payload``; return the reply's payload.

        Raises ``IndeterminateError`` naming the address if no reply arrives in
        time (the request may or may not have been applied)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        sock = self._socket()
        monitor = self._monitor(sock) if timeout > WATCH_AFTER_S else None
        request_id = next(self._ids).to_bytes(_ID_BYTES, "big")
        sock.send(request_id + payload)
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            reply = self._receive(sock, monitor, max(1, int(remaining * 1000)))
            if reply is not None and reply[:_ID_BYTES] == request_id:
                return reply[_ID_BYTES:]
            # otherwise none in time, or a late reply to an abandoned request
        self._reset()
        raise IndeterminateError(
            f"no reply from {self.address} within {timeout:.1f}s "
            "(the server may be down or busy; the request may have been applied)"
        )

    def _receive(
        self, sock: zmq.Socket, monitor: zmq.Socket | None, timeout_ms: int
    ) -> bytes | None:
        """The next reply to arrive within ``timeout_ms``, else ``None``;
        ``IndeterminateError`` if ``monitor`` tells first that the connection
        the request went out on dropped."""
        if monitor is None:
            # a receive that waits, not a poll and then a receive: one
            # let-go of the GIL a reply instead of two
            sock.setsockopt(_RCVTIMEO, timeout_ms)
            try:
                return sock.recv()
            except zmq.Again:
                return None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        ready = dict(poller.poll(timeout_ms))
        if sock in ready:
            return sock.recv()
        if monitor in ready:
            recv_monitor_message(monitor)
            self._reset()
            raise IndeterminateError(
                f"the connection to {self.address} dropped while a request waited for its "
                "reply (the server went away; the request may have been applied)"
            )
        return None

    def close(self) -> None:
        """Close every thread's socket; call once no other thread is mid-call."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for sock in self._sockets:
                self._close(sock)
            self._sockets.clear()
        self._ctx.term()
