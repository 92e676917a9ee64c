"""One host's processes of a cluster, run by an agent on that host.

A :class:`HostAgent` is what a cluster has on each host: it holds the host's
run directory (sockets and logs) and its starter (a zygote forking children,
or fresh interpreters), starts the launches it is given there, tells which of
them exited, kills and reaps them. Placed on another machine (a Ray actor
pinned to its node, :mod:`shardsink.hosts.ray`) it is driven through
:class:`AgentRequest`/:class:`AgentReply` bytes only, decoded strictly: what
reaches it is never unpickled by shardsink.

Its children die with it: the zygote and fresh interpreters die with their
parent (``PR_SET_PDEATHSIG``) and the zygote's children with the zygote, so a
host whose agent is SIGKILLed (its node removed) keeps no process of the
cluster, though each child leads its own process group, out of reach of the
process-group clean-up of whatever ran the agent. Segments are swept by the
next agent of the cluster on that host (their creators are dead).
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Sequence
from typing import Literal

import msgspec

from .._wire import Message
from ..process import Child, Launch, SpawnStarter, Starter, Zygote, kill_all, make_run_dir
from ..shm import sweep

Start = Literal["fork", "spawn"]


class Exited(Message):
    """A child that exited: its name, pid and status (``-N``: signal N)."""

    name: str
    pid: int
    returncode: int


class Where(Message):
    """Where an agent runs: host name, its pid, its run directory."""

    host: str
    pid: int
    run_dir: str


class StartChild(Message, tag=True):
    """Start ``launch``; in the process group of the child ``leader``, if
    named (started before), else leading its own."""

    launch: Launch
    leader: str = ""


class Kill(Message, tag=True):
    """SIGKILL the children ``names`` (every one if empty) and reap them."""

    names: tuple[str, ...] = ()


class Poll(Message, tag=True):
    """Which children exited since the last poll."""


class Locate(Message, tag=True):
    """Where the agent runs."""


class Sweep(Message, tag=True):
    """Unlink the segments of the cluster whose creators are dead."""


class Tail(Message, tag=True):
    """The last ``limit`` bytes of child ``name``'s log."""

    name: str
    limit: int = 2000


class Logs(Message, tag=True):
    """The last ``limit`` bytes of every child's log (for the head to keep)."""

    limit: int = 1 << 20


AgentRequest = StartChild | Kill | Poll | Locate | Sweep | Tail | Logs


class Started(Message, tag=True):
    pid: int


class Polled(Message, tag=True):
    exited: tuple[Exited, ...]


class Located(Message, tag=True):
    where: Where


class Done(Message, tag=True):
    pass


class Text(Message, tag=True):
    text: str


class LogFile(Message):
    """The last bytes of child ``name``'s log, on host ``host``."""

    name: str
    host: str
    data: bytes


class LogFiles(Message, tag=True):
    files: tuple[LogFile, ...]


class Refused(Message, tag=True):
    """The request failed: why, in one line."""

    reason: str


AgentReply = Started | Polled | Located | Done | Text | LogFiles | Refused

encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(AgentRequest).decode
decode_reply = msgspec.msgpack.Decoder(AgentReply).decode


class HostAgent:
    """The processes of cluster ``cluster_id`` on this host, started by a
    zygote importing ``roles`` (``start`` "fork") or as fresh interpreters
    ("spawn"). :meth:`handle` answers one encoded request; :meth:`close`
    kills every child, stops the zygote and removes the run directory
    (idempotent)."""

    def __init__(self, cluster_id: str, roles: Sequence[str], start: Start = "fork") -> None:
        self.run_dir = make_run_dir(cluster_id)
        self.cluster_id = cluster_id
        self.children: dict[str, Child] = {}
        self._reported: set[tuple[str, int]] = set()
        self._zygote = Zygote(roles, self.run_dir).start() if start == "fork" else None
        self.starter: Starter = self._zygote or SpawnStarter()
        self._closed = False
        sweep(cluster_id)  # segments of an earlier agent of this cluster, killed with its host

    def handle(self, request: bytes) -> bytes:
        """Answer an encoded :data:`AgentRequest` with an encoded
        :data:`AgentReply` (:class:`Refused` for one that fails or does not
        decode)."""
        try:
            return encode(self._answer(decode_request(request)))
        except (msgspec.ValidationError, msgspec.DecodeError, RuntimeError, OSError) as exc:
            return encode(Refused(f"{type(exc).__name__}: {exc}"))

    def _answer(self, request: AgentRequest) -> AgentReply:
        if self._closed:
            raise RuntimeError("the agent is closed")
        if isinstance(request, StartChild):
            return Started(self.start(request.launch, request.leader))
        if isinstance(request, Kill):
            self.kill(request.names)
            return Done()
        if isinstance(request, Poll):
            return Polled(tuple(self.exited()))
        if isinstance(request, Sweep):
            sweep(self.cluster_id)
            return Done()
        if isinstance(request, Tail):
            if request.name not in self.children:
                raise RuntimeError(f"no child named {request.name}")
            return Text(self.children[request.name].log_tail(request.limit))
        if isinstance(request, Logs):
            return LogFiles(tuple(self.logs(request.limit)))
        return Located(Where(socket.gethostname(), os.getpid(), str(self.run_dir)))

    def start(self, launch: Launch, leader: str = "") -> int:
        """Start ``launch`` (again, if a child of its name exited); its pid."""
        lead = self.children.get(leader) if leader else None
        if leader and lead is None:
            raise RuntimeError(f"no child {leader!r} to lead {launch.name!r}")
        child = self.children.get(launch.name)
        if child is None or child.launch != launch or child.leader is not lead:
            child = Child(launch, self.starter, self.run_dir, leader=lead)
            self.children[launch.name] = child
        return child.start().pid

    def logs(self, limit: int) -> list[LogFile]:
        """The last ``limit`` bytes of each child's log (they live in the run
        directory, which goes with the agent)."""
        host = socket.gethostname()
        out = []
        for child in self.children.values():
            child.note_exit()
            try:
                with open(child.log_path, "rb") as f:
                    f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
                    out.append(LogFile(child.name, host, f.read(limit)))
            except OSError:
                continue  # never started: no log
        return out

    def exited(self) -> list[Exited]:
        """The children that exited since the last call (each reported once)."""
        out = []
        for child in self.children.values():
            if child.proc is None or child.alive():
                continue
            key = (child.name, child.pid)
            if key not in self._reported:
                self._reported.add(key)
                out.append(Exited(child.name, child.pid, child.returncode or 0))
        return out

    def kill(self, names: Sequence[str] = ()) -> None:
        """SIGKILL the children ``names`` (every one if empty), reap them."""
        unknown = [n for n in names if n not in self.children]
        if unknown:
            raise RuntimeError(f"no child named {', '.join(unknown)}")
        chosen = [self.children[n] for n in names] if names else list(self.children.values())
        kill_all([c for c in chosen if c.proc is not None])

    def close(self) -> None:
        """Kill every child, stop the zygote, remove the run directory and
        the segments the children left. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.kill()
        if self._zygote is not None:
            self._zygote.stop()
        sweep(self.cluster_id)
        shutil.rmtree(self.run_dir, ignore_errors=True)
