"""Whole clusters: every mode, 1x4 and 2x4, every workload, read back exactly;
and the part counts each mode promises."""

from __future__ import annotations

import psutil
import pytest

from shardsink._curve import KEYS_ENV
from shardsink.builder.group import HELD_PER_SENDER_MAX
from shardsink.cluster import Cluster, ClusterConfig, Workload
from shardsink.coordinator.threshold import MAX_BYTES, MIN_BYTES, START_BYTES
from shardsink.process import ConsensusProcess
from shardsink.server.config import ServeConfig
from shardsink.shm import MESSAGE_PART_MAX_BYTES
from tests.helpers.cluster import run_cluster, workers_with_rows

#: Small but with every feature: churn retracts from interval 2 on; hydrate's
#: interval 0 (1,500 rows per worker, ~90 KB) exceeds the 64 KiB threshold, so
#: it goes through the workers' own batches while later intervals share.
SHAPES = {
    "trickle": {"rows_per_interval": 200},
    "churn": {"rows_per_interval": 200},
    "hydrate": {"rows_per_interval": 200, "snapshot_rows": 12_000},
}
THRESHOLD = 64 << 10
INTERVALS = 4
#: Parts of these shapes (~1.5 KB per worker and interval) are far below the
#: 32 KiB up to which a part travels inline in the ZeroMQ message, so the
#: sharing modes run once more with that limit at 0: every part through a
#: worker's shared-memory arena.
TRANSPORTS = {"inline": MESSAGE_PART_MAX_BYTES, "segments": 0}
#: Best-effort lands near one shared batch per group and interval, not at it:
#: a worker that joins later than the linger starts a second one.
BEST_EFFORT_BATCHES_PER_GROUP_MAX = 1.5
#: The default 10 ms linger is tuned for a warm cluster; a loaded CI machine
#: once started the four workers of a fresh 1x4 more than 10 ms apart and gave
#: interval 0 four shared batches, and with two test runs at once a 500 ms
#: linger still left 1.625 per group. A linger only costs time when a worker
#: is that late, so these counts use one no scheduler delay reaches.
TEST_LINGER_MS = 10_000


def _main_case(tmp_path, mode: str, groups: int, workload: str, **overrides):
    """A run of :data:`INTERVALS` intervals of ``workload`` at ``groups``x4,
    read back exact without a restart; the run and its workload."""
    run = run_cluster(
        tmp_path,
        INTERVALS,
        groups=groups,
        workers=4,
        mode=mode,
        workload=workload,
        shared_max_bytes=THRESHOLD,
        **SHAPES[workload],
        **overrides,
    )
    stats = run.stats
    assert stats.verified is True, stats.verify_detail
    assert stats.appends == INTERVALS and stats.restarts == 0 and stats.abandoned_attempts == 0
    assert stats.cas_per_append == 1.0
    return run, Workload(workload, **SHAPES[workload])


@pytest.mark.parametrize("workload", list(SHAPES))
@pytest.mark.parametrize("groups", [1, 2], ids=["1x4", "2x4"])
@pytest.mark.parametrize(
    ("mode", "transport"),
    [
        ("off", "inline"),
        ("best-effort", "inline"),
        ("barrier", "inline"),
        ("best-effort", "segments"),
        ("barrier", "segments"),
    ],
    ids=lambda v: v,
)
def test_shard_equals_the_expected_collection(tmp_path, mode, transport, groups, workload):
    run, spec = _main_case(
        tmp_path,
        mode,
        groups,
        workload,
        message_part_max_bytes=TRANSPORTS[transport],
        best_effort_linger_ms=TEST_LINGER_MS,
    )
    n = groups * 4
    shared_records = []
    for record in run.records:
        active = workers_with_rows(spec, record.interval, n)
        parts = record.data_parts + record.inline_parts
        # hydrate's interval 0 is above the threshold: the workers' own batches
        shared = mode != "off" and not (workload == "hydrate" and record.interval == 0)
        if not shared:  # one batch per worker that had rows
            assert record.own_batches == active and not record.shared_batches
            assert parts == active
        else:
            shared_records.append(record)
            assert record.own_batches == 0
            assert parts <= active  # never more parts than off
            assert set(record.shared_batches) == set(range(groups))  # every group shared
            if mode == "barrier":  # exactly one part per group
                assert record.shared_batches == dict.fromkeys(range(groups), 1)
                assert parts == groups
        # each worker with rows sends its builder one part of them
        through_segments = active if shared and transport == "segments" else 0
        assert record.segment_parts == through_segments
    if mode == "best-effort":
        batches = sum(sum(r.shared_batches.values()) for r in shared_records)
        per_group = batches / (groups * len(shared_records))
        assert per_group <= BEST_EFFORT_BATCHES_PER_GROUP_MAX, [
            r.shared_batches for r in shared_records
        ]


@pytest.mark.parametrize("workload", list(SHAPES))
@pytest.mark.parametrize("groups", [1, 2], ids=["1x4", "2x4"])
@pytest.mark.parametrize("mode", ["best-effort", "barrier"])
def test_host_coalescing_writes_one_part_per_host_and_interval(tmp_path, mode, groups, workload):
    """``coalesce`` host: the groups' shared rows reach one host builder, so a
    barrier appends exactly one part per interval whatever the groups, and
    best-effort never more than off (one per worker with rows); above the
    threshold the workers still write their own batches."""
    run, spec = _main_case(
        tmp_path, mode, groups, workload, coalesce="host", best_effort_linger_ms=TEST_LINGER_MS
    )
    assert run.stats.coalesce == "host"
    host_batches = []
    for record in run.records:
        active = workers_with_rows(spec, record.interval, groups * 4)
        parts = record.data_parts + record.inline_parts
        if workload == "hydrate" and record.interval == 0:  # above the threshold
            assert record.own_batches == active and not record.shared_batches
            assert parts == active
            continue
        assert record.own_batches == 0 and parts <= active
        host_batches.append(sum(record.shared_batches.values()))
        if mode == "barrier":
            assert parts == 1 and host_batches[-1] == 1
    if mode == "best-effort":
        assert sum(host_batches) / len(host_batches) <= BEST_EFFORT_BATCHES_PER_GROUP_MAX


def test_host_coalescing_through_shared_memory_counts_both_hops(tmp_path):
    """With every part through a segment: each worker's part to its group
    builder, then each group's rows to the host builder."""
    run = run_cluster(
        tmp_path,
        2,
        groups=2,
        workers=4,
        mode="barrier",
        coalesce="host",
        rows_per_interval=200,
        message_part_max_bytes=0,
    )
    assert run.stats.verified is True, run.stats.verify_detail
    assert [r.segment_parts for r in run.records] == [8 + 2, 8 + 2]
    assert [r.data_parts + r.inline_parts for r in run.records] == [1, 1]


@pytest.mark.parametrize("coalesce", ["group", "host"])
@pytest.mark.parametrize("mode", ["best-effort", "barrier"])
def test_idle_intervals_write_nothing(tmp_path, mode, coalesce):
    run = run_cluster(
        tmp_path, 3, groups=1, workers=4, mode=mode, coalesce=coalesce, rows_per_interval=0
    )
    assert run.stats.verified is True and run.stats.upper == 3000
    assert run.stats.blob_puts == 0
    assert all(r.data_parts == r.inline_parts == 0 for r in run.records)
    assert not list((tmp_path / "blob").rglob("*.parquet"))


@pytest.mark.parametrize("coalesce", ["group", "host"])
def test_a_worker_sharing_more_than_its_arena_holds_gets_its_space_back(tmp_path, coalesce):
    """90 MB from one worker through the shared batch: its parts stay in its
    64 MiB arena until acknowledged, so the builder writes a part every
    HELD_PER_SENDER_MAX instead of waiting for blob_target_bytes (128 MiB);
    it used to leave the worker waiting until the group was restarted. With
    ``coalesce`` host the group builder copies them out of the arena every
    HELD_PER_SENDER_MAX instead, and the host builder writes the parts."""
    run = run_cluster(
        tmp_path,
        1,
        groups=1,
        workers=1,
        mode="barrier",
        coalesce=coalesce,
        workload="hydrate",
        rows_per_interval=100,
        snapshot_rows=1_500_000,
        shared_max_bytes=1 << 40,
        max_restarts=0,
    )
    assert run.stats.verified is True and run.stats.restarts == 0
    record = run.records[0]
    assert record.shared_batches == {0: 1} and record.own_batches == 0
    assert 2 <= record.data_parts <= 90_000_000 // HELD_PER_SENDER_MAX + 1  # not 1 part


def test_an_auto_threshold_is_minted_every_interval_and_small_writes_still_share(tmp_path):
    """hydrate's interval 0 (~1.5 MB a worker) is above auto's 1 MiB start: the
    workers write their own batches; the 50-row writes after it share, whatever
    the rule makes of the timings (it never goes below MIN_BYTES)."""
    run = run_cluster(
        tmp_path,
        5,
        groups=1,
        workers=4,
        mode="barrier",
        workload="hydrate",
        rows_per_interval=200,
        snapshot_rows=100_000,
        shared_max_bytes="auto",
    )
    assert run.stats.verified is True and run.stats.shared_max_bytes == "auto"
    first, *rest = run.records
    assert first.shared_max_bytes == START_BYTES and first.own_batches == 4
    assert all(MIN_BYTES <= r.shared_max_bytes <= MAX_BYTES for r in rest)
    assert all(r.own_batches == 0 and r.shared_batches == {0: 1} for r in rest)


def test_a_rerun_continues_from_the_shards_upper(tmp_path):
    first = run_cluster(tmp_path, 3, groups=1, workers=2, workload="churn", rows_per_interval=50)
    second = run_cluster(tmp_path, 2, groups=1, workers=2, workload="churn", rows_per_interval=50)
    assert [r.interval for r in first.records] == [0, 1, 2]
    assert [r.interval for r in second.records] == [3, 4]
    assert second.stats.verified is True and second.stats.upper == 5000


def test_a_running_consensus_server_is_used_and_left_running(tmp_path, monkeypatch):
    blob = f"file://{tmp_path / 'blob'}"
    store = f"sqlite://{tmp_path / 'consensus.db'}"
    monkeypatch.setenv(KEYS_ENV, str(tmp_path / "keys"))  # the server's CURVE keys
    with ConsensusProcess(store, blob, ServeConfig(bind="tcp://127.0.0.1:0")) as server:
        run = run_cluster(
            tmp_path / "d", 3, groups=1, workers=2, consensus=server.address, blob=blob
        )
        assert run.stats.verified is True and run.stats.upper == 3000
        assert "consensus" not in run.stats.peak_rss  # not the cluster's process
        assert server.alive()
    assert not (tmp_path / "d" / "consensus.db").exists()


@pytest.mark.parametrize(
    ("bind", "problem"),
    [
        ("tcp://127.0.0.1", "expected HOST:PORT"),
        ("ipc://relative/consensus", "ipc path must be absolute"),
    ],
)
def test_a_bad_consensus_bind_is_named_before_any_process_starts(tmp_path, bind, problem):
    config = ClusterConfig(data_dir=str(tmp_path), consensus_bind=bind)
    with pytest.raises(ValueError, match=problem):
        Cluster(config).start()
    assert not [c for c in psutil.Process().children() if c.name() == "shardsink consensus"]


@pytest.mark.postgres
def test_a_postgresql_store_gets_its_own_consensus_process(tmp_path, postgres_server):
    run = run_cluster(
        tmp_path,
        3,
        groups=1,
        workers=2,
        mode="barrier",
        consensus=postgres_server.new_database(),
    )
    assert run.stats.verified is True and run.stats.upper == 3000
    assert "consensus" in run.stats.peak_rss
