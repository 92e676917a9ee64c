"""Process groups on the nodes of a Ray cluster, through their host agents.

:class:`RayGroups` is the :class:`~.groups.GroupHost` of a cluster whose
groups run on other hosts: one :class:`~shardsink.hosts.ray.RemoteAgent` per
node, pinned there. Group ``g`` runs on host ``g mod H`` of the ``H`` placed
at the start (the live hosts in turn once that one is gone), and with
``coalesce`` host each host that runs groups runs its own host builder;
members' launches are built as :class:`~.groups.LocalGroups` builds them,
with their host's run directory. What the agents say reaches the supervisor
through :meth:`RayGroups.watch`, which never blocks: a poll is in flight per
agent and is read once its reply is there.

A host is gone when its agent is (its node removed or dead: Ray's GCS says
so after its health checks) or has not answered for ``host_timeout_s``; its
members are then dead (``-9``) and the supervisor restarts their groups on
the live hosts. Within a host, parts still go from worker to builder (and to
the host builder) through shared memory; between hosts every socket is TCP
(the coordinator's with CURVE).
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import time
from pathlib import Path
from typing import Any

import msgspec

from .. import protocol
from ..config import ClusterConfig
from ..hosts import (
    AgentError,
    AgentGone,
    AgentReply,
    Kill,
    Locate,
    LogFiles,
    Logs,
    Poll,
    Polled,
    RemoteAgent,
    Start,
    StartChild,
    Started,
    Sweep,
    Tail,
    Text,
    alive_nodes,
    connect,
    inherited_env,
    locate,
    place_agent,
    place_agents,
)
from ..process import Launch, Launched, file_name
from .errors import ClusterError
from .groups import Group, HostInfo, Member, Sockets, group_launches, host_launch, members_of

log = logging.getLogger(__name__)

KILLED = -signal.SIGKILL
#: How long a failure report waits for a log tail from another host.
TAIL_TIMEOUT_S = 5.0
#: How often lost hosts look for a node to take their place.
REPLACE_EVERY_S = 2.0


class RemoteMember(Launched):
    """A member started by ``agent`` (pid ``pid`` on its host; 0 and
    ``exit`` -9 for one that could not be started there). Its log lives on
    its host, in the agent's run directory."""

    def __init__(
        self, launch: Launch, agent: RemoteAgent, pid: int, pgid: int, exit: int | None = None
    ) -> None:
        self.launch = launch
        self.agent = agent
        self.pid = pid
        self.pgid = pgid
        self.exit = exit

    @property
    def returncode(self) -> int | None:
        return self.exit

    def alive(self) -> bool:
        return self.exit is None

    def log_tail(self, limit: int = 2000) -> str:
        """Its log's tail, asked of its agent (a line saying why not, if
        the agent is gone or silent)."""
        try:
            reply = self.agent.call(Tail(self.name, limit), TAIL_TIMEOUT_S)
        except (AgentError, TimeoutError) as exc:
            return f"(its log is on node {self.agent.node_id}: {exc})"
        return reply.text if isinstance(reply, Text) else ""

    def __repr__(self) -> str:
        return f"RemoteMember({self.name!r}, pid={self.pid}, node={self.agent.node_id[:8]})"


class RayGroups:
    """The groups of one cluster on ``agents`` (see the module doc): host
    ``i`` is a slot, held by ``placed[i]`` (its agent now) and given to a
    new agent when that one is lost (an agent that did not come up, its
    ``where`` ``None``, is lost from the start). Lost slots are offered to alive nodes
    without an agent of the cluster every :data:`REPLACE_EVERY_S`; an agent
    placed there is used once it is located. At :meth:`close`, the logs of
    the members on the agents alive are copied into ``keep`` (the head's log
    directory), appended to what an earlier agent's copy left there, since
    an agent's run directory goes with it."""

    def __init__(
        self,
        sockets: Sockets,
        agents: list[RemoteAgent],
        *,
        host_timeout_s: float,
        keep: Path | None = None,
    ) -> None:
        if not agents:
            raise ClusterError("no host to run the groups on")
        self.sockets = sockets
        self.config = sockets.config
        self.placed = list(agents)
        self.alive = [a for a in agents if a.where is not None]
        self.host_timeout_s = host_timeout_s
        self.members: dict[str, RemoteMember] = {}
        self._polls: dict[str, Any] = {}
        self._answered = {a.node_id: time.monotonic() for a in agents}
        self._on: dict[int, RemoteAgent] = {}  # group -> the agent it was launched on
        self._joining: dict[int, tuple[RemoteAgent, Any, float]] = {}  # slot -> (agent, ref, since)
        self._lost = [a not in self.alive for a in agents]  # by slot: lost, not yet replaced
        self._looked = time.monotonic()
        self._every: list[RemoteAgent] = list(agents)  # to close
        self._closed = False
        self.keep = keep

    # --- GroupHost --------------------------------------------------------------------

    def launch(self, index: int) -> Group:
        if self.config.host_lost == "wait":
            self._await_slot(index % len(self.placed))
        host = self.host_of(index)
        agent = self.placed[host]
        self._on[index] = agent
        builder_launch, *worker_launches = group_launches(
            self.sockets, self._run_dir(agent), index, host
        )
        builder = self._start(agent, builder_launch, leader=None)
        workers = [self._start(agent, launch, leader=builder) for launch in worker_launches]
        return Group(index, builder, list(workers))

    def launch_hosts(self) -> dict[int, Member]:
        out: dict[int, Member] = {}
        for host, agent in enumerate(self.placed):
            groups = tuple(g for g in range(self.config.groups) if self.host_of(g) == host)
            if groups:
                launch = host_launch(self.sockets, self._run_dir(agent), host, groups)
                out[host] = self._start(agent, launch, leader=None)
        return out

    def host_of(self, index: int) -> int:
        """Group ``index``'s host: slot ``index mod H`` while its agent lives
        (always, with ``host_lost`` "wait"), else the live slots in turn."""
        slot = index % len(self.placed)
        if self.placed[slot] in self.alive or self.config.host_lost == "wait":
            return slot
        live = [i for i, agent in enumerate(self.placed) if agent in self.alive]
        if not live:
            raise ClusterError("every host of the cluster is gone")
        return live[index % len(live)]

    def agent_of(self, index: int) -> RemoteAgent:
        """The agent of group ``index``'s host (:meth:`host_of`)."""
        return self.placed[self.host_of(index)]

    def kill(self, members: list[Member]) -> None:
        by_agent: dict[str, list[RemoteMember]] = {}
        for member in members_of(members, RemoteMember):
            if member.alive():
                by_agent.setdefault(member.agent.node_id, []).append(member)
        for chosen in by_agent.values():
            agent = chosen[0].agent
            self._ask(agent, Kill(tuple(m.name for m in chosen)))
            for member in chosen:
                member.exit = KILLED

    def stop(self, members: list[Member], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(m.alive() for m in members) and time.monotonic() < deadline:
            self.watch()
            time.sleep(0.05)
        self.kill(members)

    def after_kill(self) -> None:
        for agent in list(self.alive):
            self._ask(agent, Sweep())

    def watch(self) -> None:
        """Read the polls whose replies are in, send the next ones; a gone
        agent's, or one silent past ``host_timeout_s``, members are dead.
        Then offer lost slots to nodes without an agent."""
        import ray

        now = time.monotonic()
        for agent in list(self.alive):
            ref = self._polls.get(agent.node_id)
            if ref is None:
                self._polls[agent.node_id] = agent.submit(_POLL)
                continue
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                if now - self._answered[agent.node_id] > self.host_timeout_s:
                    self._lose(agent, f"no answer for {self.host_timeout_s}s")
                continue
            del self._polls[agent.node_id]
            reply = self._ask(agent, ref=ref)
            if not isinstance(reply, Polled):
                continue
            self._answered[agent.node_id] = now
            for exited in reply.exited:
                member = self.members.get(exited.name)
                if member is not None and member.pid == exited.pid:
                    member.exit = exited.returncode
        self._replace(now)

    def peak_rss(self, member: Member) -> int | None:
        return None  # on another host: its /proc is not this one's

    def hosts(self) -> list[HostInfo]:
        return [
            HostInfo(
                index=slot,
                hostname=_host_name(agent),
                node_id=agent.node_id,
                address=agent.address,
                alive=agent in self.alive,
            )
            for slot, agent in enumerate(self.placed)
        ]

    def misplaced(self) -> list[int]:
        return [
            g
            for g, agent in sorted(self._on.items())
            if agent in self.alive and self.placed[self.host_of(g)] is not agent
        ]

    def close(self) -> None:
        """Stop every agent (and so its processes). Idempotent."""
        if self._closed:
            return
        self._closed = True
        joining = [agent for agent, _, _ in self._joining.values()]
        for agent in [*self._every, *joining]:
            if agent in self.alive:
                self._keep_logs(agent)
            agent.close(self.host_timeout_s if agent in self.alive else 1.0)

    def _keep_logs(self, agent: RemoteAgent) -> None:
        """Append the logs of ``agent``'s members to :attr:`keep`, each after
        a line naming its host (nothing kept if it does not answer)."""
        if self.keep is None:
            return
        try:
            reply = agent.call(Logs(), TAIL_TIMEOUT_S)
        except (AgentError, TimeoutError) as exc:
            log.warning("the logs on node %s are not kept: %s", agent.node_id, exc)
            return
        if not isinstance(reply, LogFiles):
            return
        for kept in reply.files:
            if kept.name not in self.members:  # only members this cluster launched name a file
                continue
            try:
                with open(self.keep / file_name(kept.name), "ab") as f:
                    f.write(f"[shardsink] the log of {kept.name} on host {kept.host!r}\n".encode())
                    f.write(kept.data)
            except OSError as exc:
                log.warning("the log of %s is not kept: %s", kept.name, exc)

    # --- hosts ------------------------------------------------------------------------

    @staticmethod
    def _run_dir(agent: RemoteAgent) -> Path:
        assert agent.where is not None  # located when placed
        return Path(agent.where.run_dir)

    def _start(self, agent: RemoteAgent, launch: Launch, leader: RemoteMember | None) -> Member:
        started = None
        if (leader is None or leader.alive()) and agent in self.alive:
            started = self._ask(agent, StartChild(launch, leader.name if leader else ""))
        if isinstance(started, Started):
            pgid = leader.pid if leader is not None else started.pid
            member = RemoteMember(launch, agent, started.pid, pgid)
        else:  # not started: dead at once, so the supervisor restarts the group
            member = RemoteMember(launch, agent, 0, 0, exit=KILLED)
        self.members[launch.name] = member
        return member

    def _ask(
        self, agent: RemoteAgent, request: Any = None, *, ref: Any = None
    ) -> AgentReply | None:
        """``agent``'s reply to ``request`` (or the one ``ref`` stands for);
        ``None`` if it refused (logged) or is gone (the host is lost)."""
        if agent not in self.alive:
            return None
        try:
            if ref is None:
                ref = agent.submit(request)
            return agent.reply(ref, self.host_timeout_s)
        except (AgentGone, TimeoutError) as exc:
            self._lose(agent, str(exc))
        except AgentError as exc:
            log.warning("%s", exc)
        return None

    def _lose(self, agent: RemoteAgent, why: str) -> None:
        """``agent``'s host is lost: its members are dead, and the agent is
        killed, so that one only silent (a stalled machine) cannot come back
        with its processes (they die with it)."""
        if agent not in self.alive:
            return
        import ray

        slot = self.placed.index(agent)
        name = _host_name(agent)
        log.warning("host %d (%s, node %s) is lost: %s", slot, name, agent.node_id, why)
        self.alive.remove(agent)
        self._lost[slot] = True
        self._polls.pop(agent.node_id, None)
        ray.kill(agent.actor, no_restart=True)
        for member in self.members.values():
            if member.agent is agent and member.alive():
                member.exit = KILLED

    def _replace(self, now: float) -> None:
        """Use the agents placed on lost slots that are located now; place
        agents for the other lost slots on alive nodes that have none (at
        most every :data:`REPLACE_EVERY_S`)."""
        for slot, (agent, ref, since) in list(self._joining.items()):
            if self._located(slot, agent, ref, since, now):
                log.warning("host %d is back: node %s (%s)", slot, agent.node_id, agent.address)
                self.placed[slot] = agent
                self.alive.append(agent)
                self._every.append(agent)
                self._lost[slot] = False
                self._answered[agent.node_id] = now
        lost = [i for i, gone in enumerate(self._lost) if gone and i not in self._joining]
        if not lost or now - self._looked < REPLACE_EVERY_S:
            return
        self._looked = now
        taken = {a.node_id for a in self.alive} | {a.node_id for a, _, _ in self._joining.values()}
        free = [(n, address) for n, address in alive_nodes().items() if n not in taken]
        for slot, (node_id, address) in zip(lost, free, strict=False):
            agent = place_agent(
                self.sockets.cluster_id,
                protocol.CHILD_ROLES,
                node_id,
                address,
                start=_start_of(self.config),
                env=inherited_env(),
            )
            self._joining[slot] = (agent, agent.submit(Locate()), now)

    def _located(self, slot: int, agent: RemoteAgent, ref: Any, since: float, now: float) -> bool:
        """Whether the agent placed for ``slot`` is up (its Locate answered);
        one that fails, or is not up within ``start_timeout_s``, is dropped."""
        import ray

        ready, _ = ray.wait([ref], timeout=0)
        if not ready and now - since < self.config.start_timeout_s:
            return False
        del self._joining[slot]
        try:
            if not ready:
                raise TimeoutError(f"not up within {self.config.start_timeout_s}s")
            locate(agent, ref, self.host_timeout_s)
        except (AgentError, TimeoutError) as exc:
            log.warning("an agent for host %d on node %s: %s", slot, agent.node_id, exc)
            ray.kill(agent.actor, no_restart=True)
            return False
        return True

    def _await_slot(self, slot: int) -> None:
        """Wait until slot ``slot`` has a live agent (``host_lost`` "wait").
        :class:`ClusterError` if none comes within ``start_timeout_s``."""
        deadline = time.monotonic() + self.config.start_timeout_s
        while self.placed[slot] not in self.alive:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"host {slot} is lost and no Ray node without an agent of the cluster "
                    f"came to take its place within {self.config.start_timeout_s}s"
                )
            self.watch()
            time.sleep(0.1)


_POLL = Poll()


def _start_of(config: ClusterConfig) -> Start:
    return "fork" if config.start == "fork" else "spawn"


def _host_name(agent: RemoteAgent) -> str:
    return agent.where.host if agent.where is not None else "?"


def place_hosts(
    config: ClusterConfig, cluster_id: str
) -> tuple[ClusterConfig, list[RemoteAgent] | None]:
    """With ``hosts`` ``ray:ADDRESS``: a host agent on each Ray node, and the
    config made the whole cluster's (``groups`` on each host, a TCP
    coordinator socket: loopback unless ``coordinator_bind`` says); with
    ``local``, ``config`` and no agents. :class:`ClusterError` for a
    ``file://`` blob store on several hosts not declared shared."""
    address = ray_address(config.hosts)
    if address is None:
        return config, None
    agents = place(
        address,
        cluster_id,
        start=_start_of(config),
        max_hosts=config.max_hosts,
        timeout_s=config.start_timeout_s,
    )
    if config.blob_uri.startswith("file://") and len(agents) > 1 and not config.blob_shared:
        close_agents(agents)
        raise ClusterError(
            f"blob store {config.blob_uri} is a directory, and every host must reach it: "
            f"use s3://, or say the directory is shared by every one of the "
            f"{len(agents)} hosts (--blob-shared)"
        )
    whole = msgspec.structs.replace(
        config,
        groups=config.groups * len(agents),
        coordinator_bind=config.coordinator_bind or "tcp://127.0.0.1:0",
    )
    return whole, agents


def close_agents(agents: list[RemoteAgent]) -> None:
    """Stop host agents no supervisor holds (their processes go with them)."""
    for agent in agents:
        agent.close(timeout_s=10.0)


def ray_address(hosts: str) -> str | None:
    """The Ray address a checked ``hosts`` names (``ray:auto``,
    ``ray:HOST:PORT``), or ``None`` for ``local``."""
    return None if hosts == "local" else hosts.partition(":")[2]


def place(
    address: str, cluster_id: str, *, start: Start, max_hosts: int, timeout_s: float
) -> list[RemoteAgent]:
    """Join the Ray cluster at ``address`` and place one host agent per node
    (at most ``max_hosts``, if not 0), each with a zygote serving the
    cluster's roles (``start`` "fork") or starting fresh interpreters.
    :class:`ClusterError` naming the cause if Ray or a node cannot be used."""
    if importlib.util.find_spec("ray") is None:  # not imported: connect() sets it up first
        needs = "pip install 'shardsink[ray]'"
        raise ClusterError(f"--hosts ray:... needs Ray: {needs}")
    try:
        connect(address)
        return place_agents(
            cluster_id,
            protocol.CHILD_ROLES,
            start=start,
            max_hosts=max_hosts,
            env=inherited_env(),
            timeout_s=timeout_s,
        )
    except (AgentError, TimeoutError, ConnectionError) as exc:
        raise ClusterError(f"placing host agents on the Ray cluster at {address}: {exc}") from None
