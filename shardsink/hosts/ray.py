"""Host agents on the nodes of a Ray cluster (``pip install 'shardsink[ray]'``).

:func:`place_agents` starts one :class:`~shardsink.hosts.agent.HostAgent` per
alive Ray node (or on the first ``max_hosts`` of them), each a Ray actor
pinned to its node (``NodeAffinitySchedulingStrategy``, not soft: it runs
there or not at all, and is never moved) asking for no CPU, so the node's
CPUs stay the cluster's processes'. What goes to an agent and back is
msgspec bytes (:mod:`shardsink.hosts.agent`); Ray carries them.

An agent whose node died, or whose process did, answers every call with
:class:`AgentGone`; Ray notices a dead node through its GCS health checks
(``health_check_period_ms`` times ``health_check_failure_threshold``: 3 s, 5 by
default, see :mod:`shardsink.testing.ray` for the tests').
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import faults
from ..process import RUN_MARK
from .agent import (
    AgentReply,
    HostAgent,
    Locate,
    Located,
    Refused,
    Start,
    Where,
    decode_reply,
    encode,
)

log = logging.getLogger(__name__)

#: Once one agent is up, how long the others of a placement have: an agent
#: killed while Ray starts it is reported dead only after tens of seconds,
#: and a start must not wait for that (the late one is replaced later).
STRAGGLER_S = 15.0

#: What the agents, and so every process they start, take from the
#: environment of the process placing them: what arms fault points and a
#: run's mark, never a store URI or a key.
INHERITED_ENV = (*faults.ENVIRONMENT, RUN_MARK)


class AgentError(RuntimeError):
    """A host agent refused a request (the reason is its one line)."""


class AgentGone(AgentError):
    """A host agent is gone: its node was removed or died, or its process did."""


class _AgentActor:
    """The Ray actor around a :class:`HostAgent` (bytes in, bytes out)."""

    def __init__(self, cluster_id: str, roles: Sequence[str], start: Start) -> None:
        self.agent = HostAgent(cluster_id, roles, start)

    def handle(self, request: bytes) -> bytes:
        return self.agent.handle(request)

    def close(self) -> None:
        self.agent.close()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


@dataclass
class RemoteAgent:
    """A host agent on Ray node ``node_id`` at ``address`` (``where``: its
    host, pid and run directory there, once located)."""

    node_id: str
    actor: Any
    where: Where | None = None
    address: str = ""

    def submit(self, request: Any) -> Any:
        """Send ``request``; the Ray object reference its reply will be."""
        return self.actor.handle.remote(encode(request))

    def reply(self, ref: Any, timeout_s: float) -> AgentReply:
        """The reply ``ref`` (from :meth:`submit`) stands for. :class:`AgentGone`
        if the agent is gone, :class:`AgentError` if it refused,
        ``TimeoutError`` if it does not answer in ``timeout_s``."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        who = f"the agent on node {self.node_id}"
        try:
            answer = ray.get(ref, timeout=timeout_s)
        except RayActorError as exc:
            raise AgentGone(f"{who} is gone: {_why(exc)}") from None
        except GetTimeoutError:
            raise TimeoutError(f"{who} did not answer in {timeout_s}s") from None
        reply = decode_reply(answer)
        if isinstance(reply, Refused):
            raise AgentError(f"{who}: {reply.reason}")
        return reply

    def call(self, request: Any, timeout_s: float) -> AgentReply:
        """Send ``request`` and wait for its reply (errors: :meth:`reply`)."""
        return self.reply(self.submit(request), timeout_s)

    def close(self, timeout_s: float) -> None:
        """Stop the agent's processes and the actor; nothing if it is gone."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        with contextlib.suppress(RayActorError, GetTimeoutError):  # gone: nothing to close
            ray.get(self.actor.close.remote(), timeout=timeout_s)
        ray.kill(self.actor, no_restart=True)


#: Read once, when ``ray`` is imported: "0" keeps a 127.0.0.1 bootstrap
#: address as it is. Otherwise Ray, assuming a cluster spans machines,
#: resolves it to this machine's routable address, where a cluster of
#: loopback nodes does not listen, and waits there for ever.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def keep_loopback() -> None:
    """Make Ray keep loopback addresses (see :data:`LOOPBACK_ENV`), in this
    process and the ones it starts. ``RuntimeError`` if ``ray`` was imported
    without it: too late to change."""
    import sys

    if os.environ.get(LOOPBACK_ENV) == "0":
        return
    if "ray" in sys.modules:
        raise RuntimeError(
            f"ray was imported before {LOOPBACK_ENV}=0 was set: it would resolve a loopback "
            "address to this machine's routable one; set it in the environment"
        )
    os.environ[LOOPBACK_ENV] = "0"


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto`` or ``HOST:PORT``) as a
    driver, unless this process already is one (a loopback ``HOST``: see
    :func:`keep_loopback`)."""
    host = address.rpartition(":")[0]
    loopback = host in ("localhost", "::1", "[::1]") or host.startswith("127.")
    if loopback:
        keep_loopback()
    import ray

    if not ray.is_initialized():
        ip = {"_node_ip_address": "127.0.0.1"} if loopback else {}
        ray.init(address=address, log_to_driver=False, **ip)


def alive_nodes() -> dict[str, str]:
    """The Ray nodes alive now, in the GCS's order: node id -> address."""
    import ray

    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


def _why(exc: BaseException) -> str:
    """One line of what Ray says of a dead actor: the line saying why, if
    there is one (its messages run to paragraphs of advice)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [repr(exc)]
    because = [line for line in lines if "because" in line]
    return (because or lines)[0].split(". Some common causes")[0]


def place_agents(
    cluster_id: str,
    roles: Sequence[str],
    *,
    start: Start = "fork",
    max_hosts: int = 0,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> list[RemoteAgent]:
    """One agent per alive node (the first ``max_hosts``, if not 0), each
    located when this returns, unless it failed to come up in ``timeout_s``,
    or :data:`STRAGGLER_S` after the first did (gone, killed meanwhile, or
    slow: then its ``where`` is ``None``, it is killed, and the cluster
    replaces it as a lost host); ``env`` is added to their environment. :class:`AgentError` if
    there is no node, or no agent came up (those placed are closed)."""
    import ray

    nodes = alive_nodes()
    if max_hosts:
        nodes = dict(list(nodes.items())[:max_hosts])
    if not nodes:
        raise AgentError("the Ray cluster has no alive node")
    agents = [
        place_agent(cluster_id, roles, node_id, address, start=start, env=env)
        for node_id, address in nodes.items()
    ]
    try:
        failed = _locate_all(agents, timeout_s)
    except BaseException:
        for agent in agents:
            ray.kill(agent.actor, no_restart=True)
        raise
    if len(failed) == len(agents):
        raise AgentError(f"no host agent came up: {'; '.join(failed)}")
    return agents


def _locate_all(agents: list[RemoteAgent], timeout_s: float) -> list[str]:
    """Locate ``agents`` as they come up, for up to ``timeout_s``, and once
    one has, the others for up to :data:`STRAGGLER_S` more; kill those that
    fail or are late. Why each failed."""
    import ray

    pending = {agent.submit(Locate()): agent for agent in agents}
    deadline = time.monotonic() + timeout_s
    failed = []
    while pending and (left := deadline - time.monotonic()) > 0:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
        for ref in ready:
            agent = pending.pop(ref)
            try:
                locate(agent, ref, timeout_s)
            except (AgentError, TimeoutError) as exc:
                failed.append(f"node {agent.node_id}: {exc}")
                ray.kill(agent.actor, no_restart=True)
            else:
                deadline = min(deadline, time.monotonic() + STRAGGLER_S)
    for agent in pending.values():
        failed.append(f"node {agent.node_id}: not up in time")
        ray.kill(agent.actor, no_restart=True)
    for why in failed:
        log.warning("a host agent did not come up: %s", why)
    return failed


def place_agent(
    cluster_id: str,
    roles: Sequence[str],
    node_id: str,
    address: str,
    *,
    start: Start = "fork",
    env: dict[str, str] | None = None,
) -> RemoteAgent:
    """An agent pinned to node ``node_id`` (at ``address``), asked to start:
    not located yet (:func:`locate`)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor_class = ray.remote(num_cpus=0, max_restarts=0)(_AgentActor)
    options: dict[str, Any] = {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)
    }
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    actor = actor_class.options(**options).remote(cluster_id, tuple(roles), start)
    return RemoteAgent(node_id, actor, address=address)


def locate(agent: RemoteAgent, ref: Any, timeout_s: float) -> None:
    """Fill in ``agent.where`` from ``ref``, its reply to :class:`Locate`,
    and check that it runs on its node. :class:`AgentError` (or
    ``TimeoutError``) if it does not come up in ``timeout_s``."""
    reply = agent.reply(ref, timeout_s)
    if not isinstance(reply, Located):
        raise AgentError(f"the agent on node {agent.node_id} answered {reply!r} to Locate")
    agent.where = reply.where
    _check_placed(agent, timeout_s)


def inherited_env() -> dict[str, str]:
    """What of this process's environment the agents it places get
    (:data:`INHERITED_ENV`)."""
    return {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}


def _check_placed(agent: RemoteAgent, timeout_s: float) -> None:
    """:class:`AgentError` unless the agent runs on the node it was pinned to."""
    import ray

    runs_on = ray.get(agent.actor.node_id.remote(), timeout=timeout_s)
    if runs_on != agent.node_id:
        raise AgentError(f"the agent pinned to node {agent.node_id} runs on {runs_on}")
