"""The control socket of a running cluster: ``shardsink status`` and ``shardsink stop``.

The coordinator (``shardsink up``) binds a ZeroMQ REP socket at
``ipc://RUN_DIR/control`` (the run directory is 0700, so only its user reaches
it) and records the address in its data dir's lock (``Holder.control``). It is
single-threaded: :meth:`ControlServer.poll` answers whatever requests are
waiting, without blocking, from the coordinator's poll loop. Requests and
replies are msgspec Structs decoded strictly; a malformed request gets an
:class:`Refused` reply naming the problem. A :class:`StopRequest` is answered
with :class:`Stopping`, then :class:`StopRequested` is raised in the
coordinator, which stops the way Ctrl-C does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from .. import datadir
from .._address import check_address
from ..coordinator import HostInfo
from .maintenance import MaintenanceFailures

#: How long a client waits for the coordinator's answer by default.
TIMEOUT_S = 5.0


class StatusRequest(msgspec.Struct, tag="status", frozen=True, forbid_unknown_fields=True):
    """Ask for :class:`Status`."""


class StopRequest(msgspec.Struct, tag="stop", frozen=True, forbid_unknown_fields=True):
    """Ask the coordinator to stop as Ctrl-C does; answered with :class:`Stopping`."""


Request = StatusRequest | StopRequest


class ProcessStatus(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A process of the cluster. ``kind``: coordinator, consensus, builder or
    worker; ``alive`` is false for a child that exited and is not restarted
    yet (then ``rss_bytes`` and ``cpu_percent`` are 0); ``cpu_percent`` is
    over the time since the previous status request (0.0 on the first)."""

    kind: str
    name: str
    pid: int
    alive: bool
    rss_bytes: int
    cpu_percent: float


class Status(msgspec.Struct, tag="status", frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A running cluster. Rates and latencies are over the appends of the last
    ``window_s`` seconds (``appends_in_window`` of them; all 0.0 if none);
    per-append figures (and the totals ``data_parts``, ``blob_puts``) over
    every append of the run. ``metrics`` and ``dashboard`` are the URLs of its
    Prometheus metrics and its live dashboard (``None`` without
    ``--metrics-port``, ``--dashboard``). ``coalesce``: the cluster's
    ``--coalesce`` (with ``host`` in a sharing mode, ``processes`` lists the
    host builder, kind ``builder``, name ``host``). ``hosts``: where the
    groups run, one entry per host placed (``--hosts``; one for this machine
    alone). ``backlog``: with ``--rate``, the intervals due and not yet
    appended when the last append ended (0 in a closed loop)."""

    cluster_id: str
    coordinator_pid: int
    data_dir: str
    shard: str
    groups: int
    workers: int
    mode: str
    workload: str
    pace: str
    upper: int
    appends: int
    window_s: float
    appends_in_window: int
    intervals_per_s: float
    append_latency_ms_p50: float
    append_latency_ms_p99: float
    backlog: int = 0
    data_parts: int
    blob_puts: int
    data_parts_per_append: float
    blob_puts_per_append: float
    diff_bytes_per_append: float
    restarts: int
    consensus_restarts: int
    abandoned_attempts: int
    consensus: str
    metrics: str | None
    dashboard: str | None
    coalesce: str = "group"
    processes: list[ProcessStatus]
    hosts: list[HostInfo] = []
    maintenance_failures: MaintenanceFailures = MaintenanceFailures(known=False)


class Stopping(msgspec.Struct, tag="stopping", frozen=True, forbid_unknown_fields=True):
    """The coordinator took a stop request and is stopping (pid ``pid``)."""

    pid: int


class Refused(msgspec.Struct, tag="refused", frozen=True, forbid_unknown_fields=True):
    """The request was not understood; ``error`` says why."""

    error: str


Reply = Status | Stopping | Refused


class StopRequested(Exception):
    """Raised in the coordinator by :meth:`ControlServer.poll` after it answered
    a stop request (and by ``up``'s SIGTERM handler): stop as Ctrl-C does."""


class ControlError(Exception):
    """No cluster answers for a data dir; the message says why (no lock
    record, a stale one, a holder that is not a coordinator, no answer)."""


class ControlServer:
    """The coordinator's end. ``status`` builds the :class:`Status` answered;
    ``poll()`` never blocks and raises :class:`StopRequested` after answering
    a stop request. ``close()`` is idempotent."""

    def __init__(self, run_dir: Path, status: Callable[[], Status]) -> None:
        self.address = f"ipc://{run_dir / 'control'}"
        self._status = status
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(check_address(self.address, for_bind=True))
        self._decoder = msgspec.json.Decoder(Request)

    def poll(self) -> None:
        """Answer every request waiting now."""
        while self._sock is not None and self._sock.poll(0):
            raw = self._sock.recv()
            try:
                request = self._decoder.decode(raw)
            except msgspec.DecodeError as exc:
                self._reply(Refused(f"malformed control request: {exc}"))
                continue
            if isinstance(request, StopRequest):
                self._reply(Stopping(os.getpid()))
                raise StopRequested("stop requested over the control socket")
            self._reply(self._status())

    def _reply(self, reply: Reply) -> None:
        assert self._sock is not None
        self._sock.send(msgspec.json.encode(reply))

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
            self._ctx.term()


def find(data_dir: str | os.PathLike) -> datadir.Holder:
    """The coordinator holding ``data_dir``'s lock, with its control address.

    Raises :class:`ControlError` naming the data dir if no record names one,
    if the record is stale (its process is gone: reported, not obeyed) or if
    its holder is not a cluster coordinator.
    """
    path = os.path.abspath(data_dir)
    holder = datadir.recorded_holder(path)
    if holder is None:
        raise ControlError(f"no cluster runs on data dir {path}")
    if not holder.alive():
        raise ControlError(
            f"no cluster runs on data dir {path}: its lock names {holder.describe()}, which "
            "is no longer running (a stale lock; the next holder replaces it)"
        )
    if holder.kind != datadir.COORDINATOR or holder.control is None:
        raise ControlError(f"data dir {path} is held by {holder.describe()}, not a cluster")
    return holder


def request(holder: datadir.Holder, msg: Request, timeout_s: float = TIMEOUT_S) -> Reply:
    """Send ``msg`` to ``holder``'s control socket and return its reply
    (:func:`ask`, naming the coordinator by its pid)."""
    assert holder.control is not None  # find() returns only holders with one
    return ask(holder.control, msg, timeout_s, f"coordinator pid {holder.pid}")


def ask(address: str, msg: Request, timeout_s: float = TIMEOUT_S, who: str = "") -> Reply:
    """Send ``msg`` to the control socket at ``address`` and return its reply.

    Raises :class:`ControlError` naming ``who`` (default: the address) if no
    answer comes within ``timeout_s`` or the answer is malformed or a
    :class:`Refused`.
    """
    who = who or f"the coordinator at {address}"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(msgspec.json.encode(msg))
        if not sock.poll(int(timeout_s * 1000)):
            raise ControlError(f"{who} did not answer at {address} within {timeout_s:g} s")
        try:
            reply = msgspec.json.decode(sock.recv(), type=Reply)
        except msgspec.DecodeError as exc:
            raise ControlError(f"malformed answer from {who}: {exc}") from None
    finally:
        sock.close()
        ctx.term()
    if isinstance(reply, Refused):
        raise ControlError(f"{who} refused the request: {reply.error}")
    return reply
