"""The live dashboard of a running cluster (``shardsink up --dashboard``,
``shardsink chaos --dashboard``): one page, served by shardsink itself.

A :class:`Dashboard` asks its :class:`Source` for the cluster's
:class:`~shardsink.cluster.control.Status` (what ``shardsink status`` shows,
through the control socket) once a second, in a thread of its own, and keeps
a bounded history: one :class:`Sample` a second for the charts
(:data:`HISTORY` of them) and the :class:`Event`\\ s seen between two
answers, restarts and exits of processes, and faults injected
(:data:`EVENTS` of them). Its HTTP server (:class:`shardsink._http.HttpServer`,
loopback) serves the page (``index.html`` and ``dashboard.js``, shipped
beside this module: no CDN, nothing from outside the machine) and the state
as JSON at ``/api/state``, which the page polls.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from importlib import resources
from typing import Protocol

import msgspec

from ..._http import HttpServer, parse_listen
from ..control import ControlError, Status, StatusRequest, ask, find

#: Samples kept for the charts: ten minutes at one a second.
HISTORY = 600
#: Events kept.
EVENTS = 500
#: Seconds between two samples.
EVERY_S = 1.0
#: How long a sample waits for the coordinator's answer; a coordinator busy
#: longer (restarting a group, say) shows as not answering for that second.
ASK_TIMEOUT_S = 2.0
#: The files of the page, by path, with their content types.
PAGES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
}


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster at wall-clock time ``t`` (seconds). Rates and latencies
    are the status's (over its last minute; latencies ``None`` if nothing
    was appended in it); ``parts_per_append`` and
    ``puts_per_append`` are over the appends since the previous sample of
    the same coordinator (``None`` if none); ``backlog`` the status's (open
    loop: intervals due, not appended); ``rss_by_kind`` is the resident
    bytes of the live processes of each kind, summed."""

    t: float
    coordinator_pid: int
    upper: int
    appends: int
    intervals_per_s: float
    latency_ms_p50: float | None
    latency_ms_p99: float | None
    parts_per_append: float | None
    puts_per_append: float | None
    restarts: int
    backlog: int = 0
    rss_by_kind: dict[str, int] = {}


class Event(msgspec.Struct, frozen=True):
    """Something that happened by wall-clock time ``t``: ``kind`` is
    ``coordinator`` (started, restarted, stopped answering), ``restart``,
    ``exit``, ``fault`` or ``maintenance`` (a run of the shard's
    maintenance failed)."""

    t: float
    kind: str
    text: str


class Source(Protocol):
    """What a dashboard shows. Both methods are called from the dashboard's
    thread only, once a sample, and never raise."""

    def status(self) -> Status | None:
        """The cluster's status now, ``None`` if no coordinator answers."""
        ...

    def faults(self) -> list[str]:
        """The faults injected since the previous call, described."""
        ...


class ControlSource:
    """The status through a control socket: the one at ``address``, or
    the one ``data_dir``'s lock names at each call (a coordinator that a
    chaos run restarts is found again). Injects no faults."""

    def __init__(self, *, address: str | None = None, data_dir: str | None = None) -> None:
        if (address is None) == (data_dir is None):
            raise ValueError("give a control socket's address or a data dir, not both")
        self._address = address
        self._data_dir = data_dir

    def status(self) -> Status | None:
        try:
            address = self._address or find(self._data_dir).control
            reply = ask(address, StatusRequest(), ASK_TIMEOUT_S)
        except ControlError:
            return None
        return reply if isinstance(reply, Status) else None

    def faults(self) -> list[str]:
        return []


def sample_of(previous: Status | None, status: Status, t: float) -> Sample:
    """The sample of ``status`` taken at ``t``, after ``previous``."""
    recent = status.appends_in_window > 0
    appended = data_parts = puts = 0
    if previous is not None and previous.coordinator_pid == status.coordinator_pid:
        appended = status.appends - previous.appends
        data_parts = status.data_parts - previous.data_parts
        puts = status.blob_puts - previous.blob_puts
    return Sample(
        t=t,
        coordinator_pid=status.coordinator_pid,
        upper=status.upper,
        appends=status.appends,
        intervals_per_s=status.intervals_per_s,
        latency_ms_p50=status.append_latency_ms_p50 if recent else None,
        latency_ms_p99=status.append_latency_ms_p99 if recent else None,
        parts_per_append=data_parts / appended if appended > 0 else None,
        puts_per_append=puts / appended if appended > 0 else None,
        restarts=status.restarts,
        backlog=status.backlog,
        rss_by_kind=rss_by_kind(status),
    )


def rss_by_kind(status: Status) -> dict[str, int]:
    """The resident bytes of ``status``'s live processes, summed per kind."""
    out: dict[str, int] = {}
    for p in status.processes:
        if p.alive:
            out[p.kind] = out.get(p.kind, 0) + p.rss_bytes
    return out


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What the run shown was asked to do, for its progress: ``intervals``
    to append (``None``: no end, as a chaos run's cluster) and
    ``rows_per_interval`` (rows/s are intervals/s times it; ``None``: not shown)."""

    intervals: int | None = None
    rows_per_interval: int | None = None


class Watch(msgspec.Struct, frozen=True):
    """What the events are told against: the ``last`` status answered
    (``None`` before the first) and whether the latest sample was answered."""

    last: Status | None = None
    answering: bool = False


def observe(watch: Watch, status: Status | None, t: float) -> tuple[Watch, list[Event]]:
    """The watch after a sample at ``t`` that got ``status`` (``None``: no
    coordinator answered), and the events it shows: a coordinator that
    answers first, again or anew (a new pid), or stops answering; group,
    consensus and process restarts, abandoned attempts, processes that exited."""
    last = watch.last
    if status is None:
        if not watch.answering or last is None:
            return watch, []
        text = f"coordinator pid {last.coordinator_pid} stopped answering"
        return Watch(last, False), [Event(t, "coordinator", text)]
    after = Watch(status, True)
    if last is None or last.coordinator_pid != status.coordinator_pid:
        text = (
            f"coordinator pid {status.coordinator_pid} answering: {status.groups}x"
            f"{status.workers} {status.mode}, upper {status.upper}"
        )
        return after, [Event(t, "coordinator", text)]
    out = []
    if not watch.answering:
        out.append(
            Event(t, "coordinator", f"coordinator pid {status.coordinator_pid} answering again")
        )
    for name, what in (
        ("restarts", "group restarts"),
        ("consensus_restarts", "consensus restarts"),
        ("abandoned_attempts", "attempts abandoned"),
    ):
        n = getattr(status, name) - getattr(last, name)
        if n > 0:
            out.append(Event(t, "restart", f"{what}: +{n} (total {getattr(status, name)})"))
    failed, was = status.maintenance_failures.counts, last.maintenance_failures.counts
    for kind, n in sorted(failed.items()):
        if n > was.get(kind, 0):
            text = f"{kind} failed: +{n - was.get(kind, 0)} (total {n}); last: "
            out.append(Event(t, "maintenance", text + status.maintenance_failures.last))
    before = {p.name: p for p in last.processes}
    for p in status.processes:
        was = before.get(p.name)
        if was is None:
            continue
        if was.pid != p.pid:
            out.append(Event(t, "restart", f"{p.kind} {p.name}: pid {was.pid} -> {p.pid}"))
        elif was.alive and not p.alive:
            out.append(Event(t, "exit", f"{p.kind} {p.name} (pid {p.pid}) exited"))
    return after, out


class State(msgspec.Struct, kw_only=True):
    """What ``/api/state`` answers: the page's ``title``, the run's ``plan``,
    the latest answer (``None`` if the last sample got none), the samples and
    the events, oldest first."""

    title: str
    plan: Plan = Plan()
    status: Status | None
    samples: list[Sample]
    events: list[Event]


class Dashboard:
    """Serve the dashboard of ``source`` at ``listen`` (``HOST:PORT``,
    loopback; port 0: a free one), titled ``title``, showing progress
    toward ``plan``; :attr:`url` is its page.
    ``ValueError`` naming the address if it is not loopback or cannot be
    bound. ``close()`` stops the sampling thread and the server; idempotent."""

    def __init__(
        self,
        source: Source,
        listen: str,
        title: str,
        every_s: float = EVERY_S,
        plan: Plan | None = None,
    ) -> None:
        host, port = parse_listen(listen)
        self._source = source
        self._title = title
        self._plan = plan or Plan()
        self._every_s = every_s
        self._lock = threading.Lock()
        self._samples: deque[Sample] = deque(maxlen=HISTORY)
        self._events: deque[Event] = deque(maxlen=EVENTS)
        self._status: Status | None = None
        self._watch = Watch()
        self._stop = threading.Event()
        files = resources.files(__package__)
        pages = {
            path: _file_page(files.joinpath(name).read_bytes(), content_type)
            for path, (name, content_type) in PAGES.items()
        }
        pages["/api/state"] = self._state
        self._http = HttpServer(pages, host, port, name="shardsink-dashboard")
        self.url = f"{self._http.base}/"
        self._thread = threading.Thread(
            target=self._run, name="shardsink-dashboard-sampler", daemon=True
        )
        self._thread.start()

    def _state(self) -> tuple[str, bytes]:
        with self._lock:
            state = State(
                title=self._title,
                plan=self._plan,
                status=self._status,
                samples=list(self._samples),
                events=list(self._events),
            )
        return "application/json", msgspec.json.encode(state)

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self._every_s):
                return

    def sample(self) -> None:
        """Ask the source once and record what it says (the thread does, every second)."""
        status, faults, t = self._source.status(), self._source.faults(), time.time()
        with self._lock:
            if status is not None:
                self._samples.append(sample_of(self._watch.last, status, t))
            self._events.extend(Event(t, "fault", text) for text in faults)
            self._watch, events = observe(self._watch, status, t)
            self._events.extend(events)
            self._status = status

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(ASK_TIMEOUT_S + 5)
        self._http.close()


def _file_page(body: bytes, content_type: str):
    return lambda: (content_type, body)
