"""Processes killed at the worst moments: nothing is sealed without its data,
the interval is rewritten by a new attempt, the shard ends exact, and nothing
of the cluster is left."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from shardsink import faults
from shardsink.cluster import Cluster, ClusterConfig
from tests.helpers.cluster import assert_nothing_left, child_pids, run_cluster, sweep_leaked

#: 100 rows per worker: a shared batch is a Parquet part in blob, not inline.
ROWS = 400


@pytest.mark.parametrize("mode", ["barrier", "best-effort"])
@pytest.mark.parametrize("point", ["worker.before_finish", "worker.last_finisher"])
def test_last_finisher_killed_around_its_finish(tmp_path, monkeypatch, mode, point):
    """Worker 3 finishes last (it pauses before its finish while the others
    finish) and is SIGKILLed just before its finish, or once the builder
    handed it the shared batch but before it reports. Its group is
    restarted, interval 0 is not appended until attempt 1 rewrites it, and
    the shard equals the expected collection."""
    specs = ["worker.before_finish:pause@worker g0/w3", f"{point}:kill@worker g0/w3"]
    for name, value in faults.environ(specs, seed=1, fault_dir=tmp_path / "f").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(faults.ENV_PAUSE, "2")  # long enough for the others on a busy machine
    run = run_cluster(tmp_path / "d", 4, groups=1, workers=4, mode=mode, rows_per_interval=ROWS)
    fired = [(f["point"], f["action"], f["role"]) for f in faults.fired(tmp_path / "f")]
    assert fired == [
        ("worker.before_finish", "pause", "worker g0/w3"),
        (point, "kill", "worker g0/w3"),
    ]
    stats = run.stats
    assert stats.verified is True, stats.verify_detail
    assert stats.restarts == 1 and stats.abandoned_attempts == 1
    assert [(r.interval, r.attempt) for r in run.records] == [(0, 1), (1, 0), (2, 0), (3, 0)]
    leaked = sweep_leaked(tmp_path / "d", 4 * ROWS)
    if point == "worker.last_finisher":
        # the batch handed to the dead finisher was written and never reported
        assert len(leaked) == 1
    else:
        assert leaked == []


def _kill_between_intervals(
    tmp_path, kind: str, sig: int = signal.SIGKILL, name: str | None = None, **overrides
) -> Cluster:
    """Run 2 intervals of a 2x2 barrier cluster, send ``sig`` to its first
    process of ``kind`` (named ``name``, if given), which ``status`` lists,
    and run 3 more."""
    config = ClusterConfig(
        data_dir=str(tmp_path),
        groups=2,
        workers=2,
        mode="barrier",
        rows_per_interval=ROWS,
        interval_timeout_s=3.0,
        start_timeout_s=60.0,
        **overrides,
    )
    with Cluster(config) as cluster:
        cluster.run(2)
        pids = child_pids(cluster)
        victim = next(p for p in cluster.processes() if p.kind == kind and name in (None, p.name))
        listed = [
            (p.kind, p.name, p.alive) for p in cluster.status().processes if p.pid == victim.pid
        ]
        assert listed == [(kind, victim.name, True)]
        os.kill(victim.pid, sig)
        stats = cluster.run(3)
        pids += child_pids(cluster)
    assert_nothing_left(pids, cluster.cluster_id)
    assert stats.verified is True and stats.appends == 5, stats.verify_detail
    return stats


@pytest.mark.parametrize("kind", ["worker", "builder"])
def test_group_with_a_dead_member_is_restarted_whole(tmp_path, kind):
    stats = _kill_between_intervals(tmp_path, kind)
    assert stats.restarts == 1


def test_a_dead_host_builder_is_restarted_with_every_group(tmp_path):
    """``coalesce`` host: the host builder's channel is numbered per group
    builder, so the host builder and both groups restart together."""
    stats = _kill_between_intervals(tmp_path, "builder", name="host", coalesce="host")
    assert stats.restarts == 2 and stats.coalesce == "host"


def test_dead_consensus_process_is_restarted_on_its_store(tmp_path):
    stats = _kill_between_intervals(tmp_path, "consensus")
    assert stats.consensus_restarts == 1 and stats.restarts == 0


def test_a_stopped_worker_misses_the_deadline_and_its_group_is_restarted(tmp_path):
    stats = _kill_between_intervals(tmp_path, "worker", signal.SIGSTOP)
    assert stats.restarts == 1 and stats.abandoned_attempts == 1


def test_builder_killed_at_a_random_moment(tmp_path):
    """A realtime run whose builder is SIGKILLed mid-run from another thread."""
    config = ClusterConfig(
        data_dir=str(tmp_path),
        groups=1,
        workers=3,
        mode="best-effort",
        rows_per_interval=ROWS,
        interval_ms=100,
        pace="realtime",
        start_timeout_s=60.0,
    )
    with Cluster(config) as cluster:
        pids = child_pids(cluster)
        builder = next(p for p in cluster.processes() if p.kind == "builder")
        timer = threading.Timer(0.35, os.kill, (builder.pid, signal.SIGKILL))
        timer.start()
        try:
            stats = cluster.run(8)
        finally:
            timer.cancel()
            timer.join()
        pids += child_pids(cluster)
    assert_nothing_left(pids, cluster.cluster_id)
    assert stats.verified is True and stats.restarts == 1, stats.verify_detail


@pytest.mark.parametrize(
    "point",
    [
        "worker.after_encode",
        "worker.after_push",
        "worker.before_report",
        "builder.after_upload",
        "builder.before_handoff",
        "worker.before_finish",
        "worker.last_finisher",
    ],
)
def test_named_fault_points_of_workers_and_builders(tmp_path, monkeypatch, point):
    """Armed through the environment (``shardsink.faults``), the first process
    to reach ``point`` is SIGKILLed, once for the whole run: its group is
    restarted and the shard is exact."""
    fault_dir = tmp_path / "faults"
    for name, value in faults.environ([f"{point}:kill"], seed=3, fault_dir=fault_dir).items():
        monkeypatch.setenv(name, value)
    run = run_cluster(
        tmp_path / "d", 4, groups=1, workers=3, mode="barrier", rows_per_interval=ROWS
    )
    assert [f["point"] for f in faults.fired(fault_dir)] == [point]
    assert run.stats.verified is True and run.stats.restarts == 1, run.stats.verify_detail


@pytest.mark.parametrize("point", ["append.before_cas", "append.after_cas"])
def test_an_append_that_fails_around_its_compare_and_set_is_retried_once(tmp_path, point):
    """The coordinator's append raises an indeterminate error before, or after
    the compare-and-set took effect: the retry appends exactly once."""
    faults.arm([f"{point}:indeterminate:1:2"], role="coordinator")
    try:
        run = run_cluster(tmp_path, 4, groups=1, workers=2, rows_per_interval=ROWS)
    finally:
        faults.disarm()
    assert run.stats.verified is True and run.stats.appends == 4, run.stats.verify_detail
    assert [r.interval for r in run.records] == [0, 1, 2, 3]


@pytest.mark.parametrize("point", ["blob.call", "consensus.call"])
@pytest.mark.parametrize("action", ["determinate", "indeterminate"])
def test_store_faults_in_the_cluster_processes(tmp_path, monkeypatch, point, action):
    """The first three store calls of the cluster's children (builders,
    workers, the consensus process) fail, before or after taking effect: the
    processes retry or are restarted, and the shard is exact."""
    fault_dir = tmp_path / "faults"
    spec = f"{point}:{action}:1:3"
    for name, value in faults.environ([spec], seed=5, fault_dir=fault_dir).items():
        monkeypatch.setenv(name, value)
    run = run_cluster(
        tmp_path / "d", 4, groups=1, workers=3, mode="barrier", rows_per_interval=ROWS
    )
    fired = faults.fired(fault_dir)
    assert [(f["point"], f["action"]) for f in fired] == [(point, action)] * 3
    assert run.stats.verified is True and run.stats.appends == 4, run.stats.verify_detail


def test_a_failing_compaction_is_in_the_runs_summary(tmp_path, monkeypatch):
    """The consensus process's merges fail (the fault point after a merge's
    output is written, armed in it only): the run still appends and
    verifies, and its summary and status say how often maintenance failed
    and why."""
    import time

    specs = ["compaction.after_write:determinate:1.0:3@consensus"]
    for name, value in faults.environ(specs, seed=1, fault_dir=tmp_path / "f").items():
        monkeypatch.setenv(name, value)
    config = ClusterConfig(data_dir=str(tmp_path / "d"), groups=1, workers=2, pace="max")
    with Cluster(config) as cluster:
        pids = child_pids(cluster)
        stats = cluster.run(16)
        deadline = time.monotonic() + 60
        while stats.maintenance_failures.counts.get("compaction", 0) < 3:
            assert time.monotonic() < deadline, stats.maintenance_failures
            stats = cluster.run(4)  # merges run beside the appends, in the consensus process
        status = cluster.status()
        pids += child_pids(cluster)
    assert_nothing_left(pids, cluster.cluster_id)
    assert stats.verified is True, stats.verify_detail
    failures = stats.maintenance_failures
    assert failures.known and failures.counts == {"compaction": 3}, failures
    assert "DeterminateError" in failures.last
    assert "compaction 3 (each retried" in failures.describe()
    assert status.maintenance_failures.counts == {"compaction": 3}
