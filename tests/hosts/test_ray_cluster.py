"""A cluster whose groups run on the nodes of a real three-node Ray cluster
on loopback (the session's ``ray_cluster``): one host agent per node, the
coordinator's socket TCP with CURVE, parts per append one per group, the
shard verified; a node removed mid-run has its groups placed on the others."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from shardsink.cluster import Cluster, ClusterConfig, ClusterError
from shardsink.coordinator.ray_groups import RemoteMember
from shardsink.process import logs
from tests.helpers.cluster import assert_nothing_left, child_pids


def _config(tmp_path, ray_cluster, **overrides) -> ClusterConfig:
    settings = {
        "hosts": f"ray:{ray_cluster.address}",
        "groups": 1,
        "workers": 2,
        "mode": "barrier",
        "rows_per_interval": 60,
        "intervals": 4,
        "start_timeout_s": 60.0,
        "interval_timeout_s": 30.0,
        "host_timeout_s": 10.0,
        "blob_shared": True,  # every node is this machine
        **overrides,
    }
    return ClusterConfig(data_dir=str(tmp_path / "data"), **settings)


def _agent_pids(cluster: Cluster) -> dict[int, int]:
    """Each group's host agent's pid, by group."""
    host = cluster.coordinator.supervisor.host
    return {g: host.agent_of(g).where.pid for g in cluster.coordinator.supervisor.groups}


@pytest.mark.parametrize("coalesce", ["group", "host"])
def test_groups_on_every_node_each_run_where_they_were_placed(tmp_path, ray_cluster, coalesce):
    nodes = ray_cluster.node_ids()
    with Cluster(_config(tmp_path, ray_cluster, coalesce=coalesce)) as cluster:
        assert cluster.placed.groups == len(nodes)  # --groups on each host
        groups = cluster.coordinator.supervisor.groups
        agents = _agent_pids(cluster)
        assert len(set(agents.values())) == len(nodes)
        for g, group in groups.items():  # every member descends from its own host's agent
            for member in group.members:
                assert isinstance(member, RemoteMember)
                parents = {p.pid for p in psutil.Process(member.pid).parents()}
                assert agents[g] in parents, (member, agents[g])
        pids = child_pids(cluster)
        names = [m.name for group in groups.values() for m in group.members]
        stats = cluster.run()
        hosts = cluster.status().hosts
    assert stats.verified
    kept = logs.runs(tmp_path / "data" / logs.LOGS)[-1]  # the agents' run dirs are gone
    for name in names:
        text = (kept / logs.file_name(name)).read_text()
        assert f"[shardsink] the log of {name} on host '" in text
    assert sorted(h.node_id for h in hosts) == sorted(nodes)
    assert all(h.alive and h.address == "127.0.0.1" for h in hosts)
    assert sorted(g for h in hosts for g in h.groups) == list(range(len(nodes)))
    # one group per host: one part per host per append, by either builder
    assert stats.data_parts_per_append + stats.inline_parts_per_append == len(nodes)
    assert stats.shared_batches_per_append == len(nodes)
    assert stats.parts_per_append_by_host == dict.fromkeys(range(len(nodes)), 1.0)
    assert_nothing_left(pids, cluster.cluster_id)


@pytest.mark.parametrize("coalesce", ["group", "host"])
def test_a_node_removed_mid_run_has_its_groups_placed_on_the_others(
    tmp_path, ray_cluster, coalesce
):
    head = ray_cluster.node_ids()[0]
    config = _config(
        tmp_path, ray_cluster, coalesce=coalesce, intervals=12, interval_ms=250, pace="realtime"
    )
    appended: list[float] = []
    try:
        with Cluster(config) as cluster:
            host = cluster.coordinator.supervisor.host
            victim_group, victim = next(
                (g, host.agent_of(g))
                for g in range(config.groups * 3)
                if host.agent_of(g).node_id != head
            )
            pids = child_pids(cluster)
            removed: list[float] = []

            two_appended = threading.Event()

            def on_append(record) -> None:
                appended.append(time.monotonic())
                if len(appended) >= 2:
                    two_appended.set()

            def remove_after_two_appends() -> None:
                two_appended.wait()
                removed.append(time.monotonic())
                ray_cluster.remove_node(victim.node_id)

            remover = threading.Thread(target=remove_after_two_appends, daemon=True)
            remover.start()
            stats = cluster.run(on_append=on_append)
            remover.join(30)
            moved_to = host.agent_of(victim_group)
            restart_s = [round(t, 2) for t in cluster.restart_times()]
        assert stats.verified and stats.restarts >= 1
        assert moved_to is not victim and moved_to in host.alive
        after = [t for t in appended if t > removed[0]]
        gaps = [b - a for a, b in zip([removed[0], *after], after, strict=False)]
        print(
            f"coalesce {coalesce}, node removed: appends after it {len(after)}, the longest "
            f"wait for one {max(gaps):.2f}s, group restarts took {restart_s}"
        )
        assert_nothing_left(pids, cluster.cluster_id)
    finally:
        if len(ray_cluster.node_ids()) < 3:
            ray_cluster.add_node()


@pytest.mark.postgres
@pytest.mark.s3
def test_one_part_per_host_with_postgresql_and_s3(
    tmp_path, ray_cluster, postgres_server, s3_server
):
    """What a fleet runs: PostgreSQL consensus, S3 blobs every host reaches,
    one host builder per host: exactly one part per host per append."""
    nodes = ray_cluster.node_ids()
    config = _config(
        tmp_path,
        ray_cluster,
        coalesce="host",
        rows_per_interval=3000,
        consensus=postgres_server.new_database(),
        blob=s3_server.blob_uri(s3_server.new_bucket()),
        blob_shared=False,
    )
    with Cluster(config) as cluster:
        pids = child_pids(cluster)
        stats = cluster.run()
    assert stats.verified
    assert stats.data_parts_per_append + stats.inline_parts_per_append == len(nodes)
    print(
        f"{len(nodes)} hosts, PostgreSQL and S3, coalesce host: "
        f"{stats.data_parts_per_append:.2f} data + {stats.inline_parts_per_append:.2f} inline "
        f"parts per append, {stats.blob_puts} blob PUTs over {stats.appends} appends"
    )
    assert_nothing_left(pids, cluster.cluster_id)


def test_a_file_blob_store_on_several_hosts_must_be_declared_shared(tmp_path, ray_cluster):
    config = _config(tmp_path, ray_cluster, blob_shared=False)
    with pytest.raises(ClusterError, match="every host must reach it"):
        Cluster(config).start()


@pytest.mark.parametrize(
    "host_lost",
    # both find the new node; move's extra run elsewhere is long for the suite's budget
    [pytest.param("move", marks=pytest.mark.slow), "wait"],
)
def test_a_node_that_joins_takes_the_place_of_a_lost_host(tmp_path, ray_cluster, host_lost):
    """A node removed between two runs of a cluster, then one added: the lost
    host's group runs on another host meanwhile (``move``) or waits for the
    new node (``wait``), then runs there; hosts() names every host, alive,
    and where its groups run. (Nodes are added by the main thread: Ray's
    ``add_node`` sets a signal handler.)"""
    head = ray_cluster.node_ids()[0]
    config = _config(tmp_path, ray_cluster, host_lost=host_lost)
    joined = ""
    try:
        with Cluster(config) as cluster:
            supervisor = cluster.coordinator.supervisor
            host = supervisor.host
            slot = next(i for i, a in enumerate(host.placed) if a.node_id != head)
            victim = host.placed[slot]
            pids = child_pids(cluster)
            cluster.run(3)
            ray_cluster.remove_node(victim.node_id)
            ray_cluster.wait_dead(victim.node_id)
            if host_lost == "move":
                cluster.run(3)
                assert host.agent_of(slot) is not victim and host.agent_of(slot) in host.alive
            joined = ray_cluster.add_node()
            deadline = time.monotonic() + 60
            while host.placed[slot].node_id != joined or host.misplaced():
                assert time.monotonic() < deadline, "the new node never took the host's place"
                cluster.run(1)
            stats = cluster.run(3)
            hosts = supervisor.hosts()
            placed_on = host.agent_of(slot).node_id
    finally:
        while len(ray_cluster.node_ids()) < 3:
            ray_cluster.add_node()
    assert stats.verified and stats.restarts >= 1
    assert all(h.alive for h in hosts) and len(hosts) == 3
    assert hosts[slot].node_id == joined and hosts[slot].groups == (slot,)
    assert hosts[slot].restarts >= 1
    assert placed_on == joined
    assert_nothing_left(pids, cluster.cluster_id)
