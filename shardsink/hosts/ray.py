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
import os
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
            raise AgentGone(f"{who} is gone: {exc}") from None
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
