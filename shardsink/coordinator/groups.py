"""Where a cluster's process groups run: the :class:`GroupHost` seam.

A group is one builder leading the OS process group, and its workers; each
member gets its :class:`~shardsink.protocol.ChildSpec` as its payload
(:func:`member_launch`). :class:`LocalGroups` runs the groups on this
machine with a :class:`~shardsink.process.Starter`; ``coordinator/ray_groups.py``
runs them on the nodes of a Ray cluster through their host agents. The
supervisor touches members only through a :class:`GroupHost` and the
:class:`Member` shape, so it cannot tell a local child from a remote one.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec

from .. import protocol
from ..config import ClusterConfig
from ..process import Child, Launch, Starter, kill_all, peak_rss, reap
from ..shm import sweep

log = logging.getLogger(__name__)

M = TypeVar("M")


class Member(Protocol):
    """A builder or worker as the supervisor sees it: ``name`` is its
    routing id (unique in a run), ``pid`` its pid on its host, ``returncode``
    ``None`` while it runs (``-N``: killed by signal N)."""

    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    pgid: int

    def alive(self) -> bool: ...

    def log_tail(self, limit: int = 2000) -> str: ...


@dataclass
class Group:
    """The processes of one group: its builder leads the OS process group."""

    index: int
    builder: Member
    workers: list[Member]
    ready: set[str] = field(default_factory=set)

    @property
    def members(self) -> list[Member]:
        return [self.builder, *self.workers]

    def dead(self) -> list[Member]:
        return [c for c in self.members if not c.alive()]


class HostInfo(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A host of the cluster: ``index`` (its host builder is
    :func:`~shardsink.protocol.host_builder_name` of it), its machine's
    ``hostname``, the Ray ``node_id`` (empty on this machine alone) and
    ``address`` of the node, ``alive``, the groups it runs now and how many
    group restarts it has seen (the supervisor fills in these two)."""

    index: int
    hostname: str
    node_id: str = ""
    address: str = ""
    alive: bool = True
    groups: tuple[int, ...] = ()
    restarts: int = 0


class GroupHost(Protocol):
    """Where a cluster's process groups run.

    ``launch(index)`` starts group ``index`` (its members say hello to the
    coordinator when they are ready); ``launch_hosts()`` starts a host
    builder on each host, by host index (``coalesce`` host), and
    ``host_of(index)`` is the host group ``index`` runs, or will run, on;
    ``kill(members)`` SIGKILLs members and returns once none runs;
    ``stop(members, timeout_s)`` waits up to ``timeout_s`` for members asked
    to exit, then kills the rest; ``after_kill()`` cleans what killed members
    left (their shared-memory segments); ``watch()`` brings what
    :meth:`Member.alive` says up to date; ``peak_rss(member)`` is its peak
    memory, ``None`` if unknown here; ``hosts()`` describes every host
    placed (those lost too); ``misplaced()`` names the groups running, alive,
    on another host than :meth:`host_of` says now (a lost host was replaced:
    the supervisor restarts them there); ``close()`` releases the host
    (idempotent)."""

    def launch(self, index: int) -> Group: ...

    def launch_hosts(self) -> dict[int, Member]: ...

    def host_of(self, index: int) -> int: ...

    def kill(self, members: list[Member]) -> None: ...

    def stop(self, members: list[Member], timeout_s: float) -> None: ...

    def after_kill(self) -> None: ...

    def watch(self) -> None: ...

    def peak_rss(self, member: Member) -> int | None: ...

    def hosts(self) -> list[HostInfo]: ...

    def misplaced(self) -> list[int]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Sockets:
    """What every member of a cluster on one host is told: the coordinator's
    address and keys, the host's run directory for its ipc sockets, and the
    shard's inline threshold."""

    config: ClusterConfig
    cluster_id: str
    coordinator: str
    inline_max_bytes: int
    coordinator_keys: protocol.CurveKeys | None = None


def member_launch(
    sockets: Sockets,
    run_dir: Path,
    g: int,
    index: int,
    role: str,
    name: str,
    *,
    host: int = 0,
    host_groups: tuple[int, ...] = (),
    ipc: str = "",
) -> Launch:
    """The launch of member ``index`` of group ``g`` (the host builder:
    ``ipc`` "host") on host ``host``, whose run directory is ``run_dir``."""
    ipc = ipc or f"g{g}"
    coalesced = sockets.config.host_builder
    spec = protocol.ChildSpec(
        group=g,
        index=index,
        cluster_id=sockets.cluster_id,
        coordinator=sockets.coordinator,
        parts=f"ipc://{run_dir / f'{ipc}.parts'}",
        handoff=f"ipc://{run_dir / f'{ipc}.handoff'}",
        inline_max_bytes=sockets.inline_max_bytes,
        config=sockets.config,
        host_parts=f"ipc://{run_dir / 'host.parts'}" if coalesced else "",
        host_handoff=f"ipc://{run_dir / 'host.handoff'}" if coalesced else "",
        coordinator_keys=sockets.coordinator_keys,
        host=host,
        host_groups=host_groups,
    )
    kind = "worker" if role == protocol.WORKER_ROLE else "builder"
    return Launch(kind=kind, name=name, role=role, payload=protocol.encode_spec(spec))


def group_launches(sockets: Sockets, run_dir: Path, g: int, host: int = 0) -> list[Launch]:
    """Group ``g``'s builder, then its workers, on host ``host``."""
    builder = member_launch(sockets, run_dir, g, 0, protocol.BUILDER_ROLE, f"g{g}/b", host=host)
    return [
        builder,
        *(
            member_launch(sockets, run_dir, g, w, protocol.WORKER_ROLE, f"g{g}/w{w}", host=host)
            for w in range(sockets.config.workers)
        ),
    ]


def host_launch(
    sockets: Sockets, run_dir: Path, host: int = 0, groups: tuple[int, ...] = ()
) -> Launch:
    """Host ``host``'s host builder (``coalesce`` host), for ``groups``
    (empty: every group)."""
    name = protocol.host_builder_name(host)
    return member_launch(
        sockets,
        run_dir,
        0,
        0,
        protocol.HOST_BUILDER_ROLE,
        name,
        host=host,
        host_groups=groups,
        ipc="host",
    )


class LocalGroups:
    """Process groups on this machine, started by ``starter`` in ``run_dir``."""

    def __init__(self, sockets: Sockets, run_dir: Path, starter: Starter) -> None:
        self.sockets = sockets
        self.run_dir = run_dir
        self.starter = starter

    def launch(self, index: int) -> Group:
        builder_launch, *worker_launches = group_launches(self.sockets, self.run_dir, index)
        builder = Child(builder_launch, self.starter, self.run_dir).start()
        workers: list[Child] = []
        try:
            for launch in worker_launches:
                workers.append(Child(launch, self.starter, self.run_dir, leader=builder).start())
        except BaseException:
            kill_all([builder, *workers])
            raise
        return Group(index, builder, list(workers))

    def launch_hosts(self) -> dict[int, Member]:
        launch = host_launch(self.sockets, self.run_dir)
        return {0: Child(launch, self.starter, self.run_dir).start()}

    def host_of(self, index: int) -> int:
        return 0

    def kill(self, members: list[Member]) -> None:
        kill_all(members_of(members, Child))

    def stop(self, members: list[Member], timeout_s: float) -> None:
        children = members_of(members, Child)
        try:
            reap(children, timeout_s)
        except TimeoutError as exc:
            log.warning("%s; killing them", exc)
        kill_all(children)  # one stuck even past SIGKILL is named in the log, not raised

    def after_kill(self) -> None:
        sweep(self.sockets.cluster_id)  # the killed members' segments: their creators are dead

    def watch(self) -> None:
        """Nothing to do: a local child's ``alive()`` reaps and asks the kernel."""

    def peak_rss(self, member: Member) -> int | None:
        return peak_rss(member.pid)

    def hosts(self) -> list[HostInfo]:
        return [HostInfo(index=0, hostname=socket.gethostname())]

    def misplaced(self) -> list[int]:
        return []

    def close(self) -> None:
        """Nothing to release: the starter is the coordinator's."""


def members_of(members: list[Member], kind: type[M]) -> list[M]:
    """``members``, each of which must be a ``kind`` (a host's own)."""
    for member in members:
        assert isinstance(member, kind), f"{member!r} is not a {kind.__name__}"
    return list(members)  # type: ignore[arg-type]
