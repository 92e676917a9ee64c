"""Host agents as Ray actors on a real three-node Ray cluster on loopback (the
session's ``ray_cluster``): each pinned to its node and running its children
there; a node removed without grace takes its agent's children with it."""

from __future__ import annotations

import time
import uuid

import psutil
import pytest

from shardsink.hosts.agent import Kill, StartChild, Started
from shardsink.hosts.ray import AgentGone, place_agents
from shardsink.process import Launch
from tests.helpers.cli import ROOT
from tests.helpers.cluster import running, wait_gone
from tests.helpers.roles import ROLES, SLEEP

ENV = {"PYTHONPATH": str(ROOT)}
TIMEOUT_S = 30.0


def _start_sleepers(agents) -> dict[str, int]:
    """One sleeping child per agent: its pid, by the agent's node."""
    pids = {}
    for agent in agents:
        launch = Launch("worker", "g0/b", SLEEP, payload=b"120", env=ENV)
        started = agent.call(StartChild(launch), TIMEOUT_S)
        assert isinstance(started, Started)
        pids[agent.node_id] = started.pid
    return pids


def _ancestors(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).parents()}


def test_an_agent_per_node_runs_its_children_on_that_node(ray_cluster):
    nodes = ray_cluster.node_ids()
    agents = place_agents(f"t{uuid.uuid4().hex[:8]}", ROLES, env=ENV, timeout_s=60)
    try:
        assert sorted(a.node_id for a in agents) == sorted(nodes)  # one per node, pinned
        pids = _start_sleepers(agents)
        for agent in agents:  # each child descends from its own node's agent
            assert agent.where is not None and agent.where.pid in _ancestors(pids[agent.node_id])
        assert len({a.where.pid for a in agents}) == len(nodes)
    finally:
        for agent in agents:
            agent.close(TIMEOUT_S)
    wait_gone(list(pids.values()), 10)


def test_a_node_removed_without_grace_leaves_no_child_of_its_agent(ray_cluster):
    agents = place_agents(f"t{uuid.uuid4().hex[:8]}", ROLES, env=ENV, timeout_s=60)
    head = ray_cluster.node_ids()[0]
    try:
        pids = _start_sleepers(agents)
        victim = next(a for a in agents if a.node_id != head)
        removed = time.monotonic()
        ray_cluster.remove_node(victim.node_id)
        gone_s = wait_gone([pids[victim.node_id]], 15)
        dead_s = ray_cluster.wait_dead(victim.node_id, 30)
        with pytest.raises(AgentGone):
            victim.call(Kill(), TIMEOUT_S)
        refused_s = time.monotonic() - removed
        print(
            f"node removed: its children gone in {gone_s:.2f}s, the GCS saw it dead "
            f"in {dead_s:.2f}s, its agent refused {refused_s:.2f}s after the removal"
        )
        survivors = [a for a in agents if a is not victim]
        assert all(running(pids[a.node_id]) for a in survivors)
    finally:
        for agent in agents:
            agent.close(TIMEOUT_S)
        if len(ray_cluster.node_ids()) < 3:
            ray_cluster.add_node()
    wait_gone(list(pids.values()), 10)
