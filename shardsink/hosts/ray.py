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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .agent import AgentReply, HostAgent, Locate, Refused, Start, Where, decode_reply, encode


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
    """A host agent on Ray node ``node_id`` (``where``: its host, pid and
    run directory there)."""

    node_id: str
    actor: Any
    where: Where | None = None

    def call(self, request: Any, timeout_s: float) -> AgentReply:
        """Send ``request`` and return its reply. :class:`AgentGone` if the
        agent is gone, :class:`AgentError` if it refused, ``TimeoutError`` if
        it does not answer in ``timeout_s``."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            reply = decode_reply(
                ray.get(self.actor.handle.remote(encode(request)), timeout=timeout_s)
            )
        except RayActorError as exc:
            raise AgentGone(f"the agent on node {self.node_id} is gone: {exc}") from None
        except GetTimeoutError:
            raise TimeoutError(
                f"the agent on node {self.node_id} did not answer in {timeout_s}s"
            ) from None
        if isinstance(reply, Refused):
            raise AgentError(f"the agent on node {self.node_id}: {reply.reason}")
        return reply

    def close(self, timeout_s: float) -> None:
        """Stop the agent's processes and the actor; nothing if it is gone."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        with contextlib.suppress(RayActorError, GetTimeoutError):  # gone: nothing to close
            ray.get(self.actor.close.remote(), timeout=timeout_s)
        ray.kill(self.actor, no_restart=True)


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto`` or ``HOST:PORT``) as a
    driver, unless this process already is one."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)


def alive_nodes() -> list[str]:
    """The ids of the Ray nodes alive now, in the GCS's order."""
    import ray

    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


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
    ready (located) when this returns; ``env`` is added to their
    environment. :class:`AgentError` if none can be placed or one does not
    come up in ``timeout_s`` (those placed are closed)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes()
    if max_hosts:
        nodes = nodes[:max_hosts]
    if not nodes:
        raise AgentError("the Ray cluster has no alive node")
    actor_class = ray.remote(num_cpus=0, max_restarts=0)(_AgentActor)
    agents = []
    for node_id in nodes:
        options: dict[str, Any] = {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)
        }
        if env:
            options["runtime_env"] = {"env_vars": dict(env)}
        actor = actor_class.options(**options).remote(cluster_id, tuple(roles), start)
        agents.append(RemoteAgent(node_id, actor))
    try:
        for agent in agents:
            agent.where = agent.call(Locate(), timeout_s).where  # type: ignore[union-attr]
            _check_placed(agent, timeout_s)
    except BaseException:
        for agent in agents:
            agent.close(timeout_s=5.0)
        raise
    return agents


def _check_placed(agent: RemoteAgent, timeout_s: float) -> None:
    """:class:`AgentError` unless the agent runs on the node it was pinned to."""
    import ray

    runs_on = ray.get(agent.actor.node_id.remote(), timeout=timeout_s)
    if runs_on != agent.node_id:
        raise AgentError(f"the agent pinned to node {agent.node_id} runs on {runs_on}")
