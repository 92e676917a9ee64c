"""Two clusters writing one shard through one consensus server: the second
follows as a replica (an interval the other appended first is skipped), so
both end with the last interval and the shard holds every interval once."""

from __future__ import annotations

from shardsink import open_shard
from shardsink.cluster import Workload
from shardsink.cluster.verify import verify
from shardsink.workloads import SCHEMA
from tests.helpers.cluster import replica_server, two_ups

INTERVALS = 60
INTERVAL_MS = 100
ROWS = 100


def test_two_clusters_on_one_shard_end_together_and_append_each_interval_once(
    tmp_path, popen, monkeypatch
):
    with replica_server(tmp_path, monkeypatch) as (server, blob):
        flags = [
            "--consensus", server.address, "--blob", blob,
            "--groups", "1", "--workers", "2", "--workload", "churn",
            "--rows-per-interval", str(ROWS), "--intervals", str(INTERVALS),
            "--interval-ms", str(INTERVAL_MS), "--pace", "realtime",
        ]  # fmt: skip
        # 60 intervals take 6 s of wall clock; a follower that retries a lost
        # append for minutes misses this by far
        results, ended = two_ups(tmp_path, popen, flags, 45)
        with open_shard("default", blob=blob, consensus=server.address, schema=SCHEMA) as shard:
            churn = Workload("churn", ROWS, interval_ms=INTERVAL_MS)
            verification = verify(shard, churn, INTERVAL_MS)
            upper = shard.upper
    assert abs(ended[1] - ended[0]) < 5, ended  # they end together
    assert verification.ok, verification.detail
    # each started at the upper it found and ran to INTERVALS past it
    assert upper == max(r["upper"] for r in results)
    assert upper >= INTERVALS * INTERVAL_MS
    assert all(r["verified"] is True for r in results)
    # every interval appended exactly once, by one of the two
    assert sum(r["appends"] for r in results) == upper // INTERVAL_MS
    # the two overlapped: at least one of them skipped what the other appended
    assert min(r["appends"] for r in results) < INTERVALS, results
