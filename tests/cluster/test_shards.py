"""Workloads of several shards through whole clusters: each shard's parts
coalesce apart, every interval is one transaction over all of them, the
read-back is exact per shard and the workload's check holds; a group killed
mid-interval appends neither shard, and no reader ever sees one shard's
interval without the other's; a second cluster on the same shards follows
as a replica; the commands read, export and verify each shard."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from shardsink import faults, open_shard, open_shards, workloads as W
from shardsink.cli import main
from shardsink.cluster import Cluster, ClusterConfig
from shardsink.cluster.verify import verify_shards
from tests.helpers.cluster import (
    assert_nothing_left,
    child_pids,
    replica_server,
    run_cluster,
    two_ups,
)

SPEC = "examples/orders_lines.py:OrdersLines"
NAMES = ["orders", "lines"]
#: Orders per interval: with 2x2 workers each worker has orders (and lines) in
#: every interval, and a shared batch of each shard is one part.
ORDERS = 40
INTERVALS = 4
#: As in test_cluster: a linger no scheduler delay reaches, so best-effort's
#: counts are those it promises.
TEST_LINGER_MS = 10_000


def _workload(orders: int = ORDERS):
    return W.of(ClusterConfig(workload=W.resolve(SPEC), rows_per_interval=orders))


def _expected(intervals: int) -> dict[str, pa.Table]:
    workload = _workload()
    schemas = W.shard_schemas(workload, SPEC)
    as_of = intervals * 1000 - 1
    return {n: W.expected(workload, schemas[n], intervals, as_of, n) for n in NAMES}


def _with_rows(interval: int, n_workers: int) -> dict[str, int]:
    """How many of ``n_workers`` global workers write rows to each shard in ``interval``."""
    workload = _workload()
    schemas = W.shard_schemas(workload, SPEC)
    tables = [W.shard_updates(workload, schemas, interval, w, n_workers, 0)
              for w in range(n_workers)]  # fmt: skip
    return {n: sum(t[n].num_rows > 0 for t in tables) for n in NAMES}


@pytest.mark.parametrize(
    ("mode", "coalesce"),
    [("off", "group"), ("best-effort", "group"), ("barrier", "group"), ("barrier", "host"),
     ("best-effort", "host")],
    ids=lambda v: v,
)  # fmt: skip
def test_every_shard_is_exact_and_coalesced_apart(tmp_path, capsys, mode, coalesce):
    """2x2: off writes a part per worker per shard; barrier one per group per
    shard, and per host with coalesce host; best-effort near that. Each
    append is every shard's, in one transaction; the read-back equals each
    shard's expected collection and the workload's check holds."""
    run = run_cluster(
        tmp_path / "d", INTERVALS, groups=2, workers=2, mode=mode, coalesce=coalesce,
        workload=SPEC, rows_per_interval=ORDERS, best_effort_linger_ms=TEST_LINGER_MS,
    )  # fmt: skip
    stats = run.stats
    assert stats.verified is True, stats.verify_detail
    assert stats.verify_detail.startswith("each of orders, lines equals its expected collection")
    assert stats.verify_detail.endswith("the workload's check holds")
    assert stats.appends == INTERVALS and stats.restarts == 0 and stats.abandoned_attempts == 0
    assert stats.shards == NAMES
    per_shard = {n: 0 for n in NAMES}
    for record in run.records:
        parts = record.parts_by_shard
        assert (
            list(parts) == NAMES and sum(parts.values()) == record.data_parts + record.inline_parts
        )
        if mode == "off":  # a worker's own batch of each shard it wrote rows to
            assert parts == _with_rows(record.interval, 4)
            assert record.own_batches == sum(parts.values()) and not record.shared_batches
        elif mode == "barrier":  # exactly one part per shard per group, or per host
            assert parts == dict.fromkeys(NAMES, 2 if coalesce == "group" else 1)
        for n in NAMES:
            per_shard[n] += parts[n]
    if mode == "best-effort":
        most = 1.5 * (2 if coalesce == "group" else 1)
        assert all(per_shard[n] / INTERVALS <= most for n in NAMES), per_shard
    assert stats.parts_per_append_by_shard == {n: per_shard[n] / INTERVALS for n in NAMES}
    if (mode, coalesce) == ("barrier", "group"):
        _commands_read_each_shard(tmp_path, capsys)


def _commands_read_each_shard(tmp_path: Path, capsys) -> None:
    """read, export and shard verify on each shard of the run's data dir;
    export of both as of one time, whole or not at all."""
    data, expected = str(tmp_path / "d"), _expected(INTERVALS)
    assert main(["read", "--data-dir", data, "--shard", "lines", "--format", "jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == expected["lines"].to_pylist()
    assert main(["shard", "verify", "--data-dir", data, "--shard", "orders"]) == 0
    capsys.readouterr()
    out = tmp_path / "snap"
    args = ["export", "--data-dir", data, "--shard", "orders", "--shard", "lines"]
    assert main([*args, "--output", str(out), "--as-of", "2999"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["as_of"] == 2999 and list(printed["shards"]) == NAMES
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "lines", "orders"]
    as_of_2999 = _expected(3)
    for n in NAMES:
        table = ds.dataset(out / n, format="parquet").to_table().sort_by([("key", "ascending")])
        assert table.equals(as_of_2999[n]), n
    assert main([*args, "--shard", "nope", "--output", str(tmp_path / "none")]) == 2
    assert "shard 'nope' does not exist" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_a_group_killed_between_its_shards_appends_neither(tmp_path, monkeypatch):
    """A worker is SIGKILLed after finishing its part of shard orders, before
    lines: the attempt is abandoned for both shards and rewritten, both end
    exact, and a reader comparing the shards' uppers throughout (orders,
    lines, orders again) never sees lines ahead of orders nor behind it."""
    specs = ["worker.after_push:kill@worker g1/w0"]
    for name, value in faults.environ(specs, seed=1, fault_dir=tmp_path / "f").items():
        monkeypatch.setenv(name, value)
    config = ClusterConfig(
        data_dir=str(tmp_path / "d"), groups=2, workers=2, mode="barrier", workload=SPEC,
        rows_per_interval=ORDERS, start_timeout_s=60.0, interval_timeout_s=30.0,
    )  # fmt: skip
    seen: list[tuple[int, int, int]] = []
    stop = threading.Event()
    with Cluster(config) as cluster:
        pids = child_pids(cluster)
        reader = threading.Thread(target=_watch_uppers, args=(cluster, stop, seen))
        reader.start()
        try:
            stats = cluster.run(INTERVALS)
        finally:
            stop.set()
            reader.join(30)
        records = cluster.records
        pids += child_pids(cluster)
    assert_nothing_left(pids, cluster.cluster_id)
    assert [(f["point"], f["role"]) for f in faults.fired(tmp_path / "f")] == [
        ("worker.after_push", "worker g1/w0")
    ]
    assert stats.verified is True, stats.verify_detail
    assert stats.restarts == 1 and stats.abandoned_attempts == 1
    assert [(r.interval, r.attempt) for r in records] == [(0, 1), (1, 0), (2, 0), (3, 0)]
    assert len(seen) > 10 and seen[-1] == (INTERVALS * 1000,) * 3
    apart = [s for s in seen if not s[0] <= s[1] <= s[2]]
    assert not apart, apart


def _watch_uppers(cluster: Cluster, stop: threading.Event, seen: list) -> None:
    """Read orders' upper, then lines', then orders' again until ``stop``
    (and once after), through the cluster's consensus process."""
    config = cluster.requested
    with open_shards(
        dict.fromkeys(NAMES), blob=config.blob_uri, consensus=cluster.shard_address
    ) as shards:
        orders, lines = shards.shard("orders"), shards.shard("lines")

        def once() -> None:
            a = orders.state(refresh=True).upper
            b = lines.state(refresh=True).upper
            seen.append((a, b, orders.state(refresh=True).upper))

        once()
        while not stop.wait(0.005):  # a look every 5 ms, until told to stop
            once()
        once()


def test_a_second_cluster_on_the_same_shards_follows_as_a_replica(tmp_path, popen, monkeypatch):
    """Two ``up`` of the two-shard workload through one consensus server:
    each interval is appended once, by one of them, to both shards (the
    other's transaction fails naming both uppers and it skips ahead), and
    both end together, verified."""
    intervals, interval_ms = 40, 100
    with replica_server(tmp_path, monkeypatch) as (server, blob):
        flags = [
            "--consensus", server.address, "--blob", blob,
            "--groups", "1", "--workers", "2", "--workload", SPEC, "--rows-per-interval", "20",
            "--intervals", str(intervals), "--interval-ms", str(interval_ms), "--pace", "realtime",
        ]  # fmt: skip
        results, _ = two_ups(tmp_path, popen, flags, 60)  # 40 intervals take 4 s
        with open_shards(dict.fromkeys(NAMES), blob=blob, consensus=server.address) as shards:
            verification = verify_shards(shards.shards, _workload(20), interval_ms)
            uppers = shards.uppers()
    assert verification.ok and verification.checked, verification.detail
    upper = uppers["orders"]
    assert uppers == {"orders": upper, "lines": upper} and upper >= intervals * interval_ms
    assert all(r["verified"] is True for r in results)
    assert sum(r["appends"] for r in results) == upper // interval_ms  # each interval once
    assert min(r["appends"] for r in results) < intervals, results  # one followed the other


class _ByDigest:
    """The example's shards and check, without ``expected``: verified by
    digest, so only the check can find what is wrong in what was written."""

    def __init__(self) -> None:
        example = _workload()
        self.shards, self.check = example.shards, example.check

    def updates(self, interval, worker, workers):
        return {}


def test_the_read_back_runs_the_workloads_check_and_needs_one_upper(tmp_path):
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/c.db"}
    workload = _workload()
    schemas = W.shard_schemas(workload, SPEC)
    with open_shards(schemas, **stores, create=True) as shards:
        txn = shards.transaction()
        tables = W.shard_updates(workload, schemas, 0, 0, 1, 0)
        lines = tables["lines"].to_pylist()
        lines[0]["val"] = {**lines[0]["val"], "order": 999}
        txn.append("orders", tables["orders"], 0, 1000)
        txn.append("lines", pa.Table.from_pylist(lines, schema=schemas["lines"]), 0, 1000)
        txn.commit()
        found = verify_shards(shards.shards, _ByDigest(), 1000)
        assert not found.ok and found.checked
        assert found.detail.startswith("the workload's check as of 999: line 0000000000-0 points "
                                       "to order 999, not there")  # fmt: skip
        assert verify_shards(shards.shards, workload, 1000).detail.startswith("shard lines: ")
        shards.writer("orders").compare_and_append([], 1000, 2000)  # orders alone moves on
        apart = verify_shards(shards.shards, workload, 1000)
        assert not apart.ok and "the shards' uppers differ" in apart.detail
    with open_shard("orders", **stores) as orders:
        assert orders.upper == 2000


@pytest.mark.parametrize("workload", [SPEC, "trickle"], ids=["two-shards", "one-shard"])
def test_expired_writers_are_renewed_and_the_interval_redone(tmp_path, workload):
    """The coordinator pauses before its first append past its writers'
    lease: the consensus process expires them, the append (a transaction of
    both shards, or one shard's) is refused, the coordinator registers a
    new writer of each shard and redoes the interval; the shards are exact."""
    faults.arm(["append.before_cas:pause:1:1"], role="coordinator", pause_s=2.5)
    config = ClusterConfig(
        data_dir=str(tmp_path), groups=1, workers=2, workload=workload, rows_per_interval=ORDERS,
        writer_lease_ms=900, append_retry_s=0.5, start_timeout_s=60.0,
    )  # fmt: skip
    try:
        with Cluster(config) as cluster:
            pids = child_pids(cluster)
            stats = cluster.run(3)
            records, renewed = cluster.records, cluster.coordinator.counters.writers_renewed
            pids += child_pids(cluster)
    finally:
        faults.disarm()
    assert_nothing_left(pids, cluster.cluster_id)
    assert stats.verified is True, stats.verify_detail
    assert renewed == len(stats.shards) == (2 if workload == SPEC else 1)
    assert [(r.interval, r.attempt) for r in records] == [(0, 1), (1, 0), (2, 0)]
