"""A real Ray cluster of several nodes on this machine, every one on loopback.

Built on ``ray.cluster_utils.Cluster`` (Ray's own multi-node test harness):
each node is a raylet with its object store, the head also runs the GCS; the
dashboard is off, object stores are small and health checks fast (Ray's own
tests use a 100 ms period and 10 failures), so a node removed without grace
is declared dead in about a second. Nodes are removed with ``remove_node``
(their processes SIGKILLed when not graceful), the cluster with
:meth:`RayTestCluster.stop` (Ray's own ``Cluster.shutdown``), never with
``ray stop``.

Loopback needs one setting, made before ``ray`` is imported
(:func:`shardsink.hosts.ray.keep_loopback`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from ..hosts import keep_loopback

#: Ray's own tests' health-check settings: a dead node noticed in ~1 s.
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 100,
    "health_check_failure_threshold": 10,
}


@dataclass
class RayTestCluster:
    """``nodes`` Ray nodes on 127.0.0.1 (the first is the head), each with
    ``cpus`` CPUs and an object store of ``object_store_bytes``. Start with
    :meth:`start`; :attr:`address` is what ``ray.init`` and ``--hosts
    ray:ADDRESS`` take. :meth:`stop` is idempotent."""

    nodes: int = 3
    cpus: int = 1
    object_store_bytes: int = 80 << 20
    _cluster: Any = field(default=None, init=False, repr=False)
    _pids: set[int] = field(default_factory=set, init=False, repr=False)

    def start(self, timeout_s: float = 120.0) -> RayTestCluster:
        """Start every node and connect this process as the driver. Raises
        ``RuntimeError`` if ``ray`` was imported before the loopback setting
        (:func:`~shardsink.hosts.ray.keep_loopback`), ``TimeoutError`` if the
        nodes are not up in time."""
        keep_loopback()
        import ray
        from ray.cluster_utils import Cluster

        before = _descendants()
        self._cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **self._node_args(),
                "include_dashboard": False,
                "_system_config": FAST_HEALTH_CHECKS,
            },
        )
        for _ in range(self.nodes - 1):
            self._cluster.add_node(**self._node_args())
        self._cluster.wait_for_nodes(timeout=timeout_s)
        ray.init(address=self.address, log_to_driver=False, _node_ip_address="127.0.0.1")
        self._pids = _descendants() - before
        return self

    def _node_args(self) -> dict:
        return {
            "num_cpus": self.cpus,
            "node_ip_address": "127.0.0.1",
            "object_store_memory": self.object_store_bytes,
        }

    @property
    def address(self) -> str:
        """The head's GCS address, ``127.0.0.1:PORT``."""
        return self._cluster.address

    def pids(self) -> set[int]:
        """The processes the nodes run, as started (the workers Ray starts
        later descend from them)."""
        return set(self._pids)

    def node_ids(self) -> list[str]:
        """The ids of the nodes alive now, the head first."""
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        nodes = [self._cluster.head_node, *self._cluster.worker_nodes]
        return [n.node_id for n in nodes if n.node_id in alive]

    def add_node(self, timeout_s: float = 60.0) -> str:
        """Start one more node; its id."""
        before = _descendants()
        node = self._cluster.add_node(**self._node_args())
        self._cluster.wait_for_nodes(timeout=timeout_s)
        self._pids |= _descendants() - before
        return node.node_id

    def remove_node(self, node_id: str, *, graceful: bool = False) -> None:
        """Remove the worker node ``node_id``: SIGKILL its processes unless
        ``graceful``. ``ValueError`` for the head or an unknown id."""
        for node in self._cluster.worker_nodes:
            if node.node_id == node_id:
                self._cluster.remove_node(node, allow_graceful=graceful)
                return
        raise ValueError(f"no worker node {node_id} in this cluster (the head cannot be removed)")

    def wait_dead(self, node_id: str, timeout_s: float = 30.0) -> float:
        """Seconds until the GCS reports ``node_id`` dead. ``TimeoutError``."""
        import ray

        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            if not any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
                return time.monotonic() - began
            time.sleep(0.05)
        raise TimeoutError(f"node {node_id} still alive after {timeout_s}s")

    def stop(self) -> None:
        """Disconnect and stop every node through Ray's ``Cluster.shutdown``
        (their processes are SIGKILLed). Idempotent."""
        cluster, self._cluster = self._cluster, None
        if cluster is None:
            return
        import ray

        ray.shutdown()
        cluster.shutdown()


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}
