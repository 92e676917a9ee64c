"""The figure runs (slow): a 4x8 trickle of 128 rows per interval in every
mode, and a 1x8 hydrate of 2 million snapshot rows. Each prints its figures
(run with ``-m slow -s``) and checks the shape they must have."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cluster import run_cluster

MIB = 1 << 20
pytestmark = pytest.mark.slow


def _figures(stats) -> dict:
    keys = (
        "mode", "groups", "workers", "workload", "appends", "data_parts_per_append",
        "inline_parts_per_append", "inline_bytes_per_append", "blob_puts", "blob_put_bytes",
        "diff_bytes_per_append", "wall_s", "startup_s", "append_latency_ms_p50",
        "append_latency_ms_p99", "verified",
    )  # fmt: skip
    out = {k: getattr(stats, k) for k in keys}
    out["peak_rss_mib"] = {k: round(v / MIB, 1) for k, v in sorted(stats.peak_rss.items())}
    return out


def test_trickle_4x8_every_mode(tmp_path):
    results = {}
    for mode in ("off", "best-effort", "barrier"):
        run = run_cluster(
            tmp_path / mode,
            50,
            groups=4,
            workers=8,
            mode=mode,
            workload="trickle",
            rows_per_interval=128,
        )
        results[mode] = run.stats
        print(json.dumps(_figures(run.stats)))
        assert run.stats.verified is True
    off, best, barrier = results["off"], results["best-effort"], results["barrier"]

    def parts(s):
        return s.data_parts_per_append + s.inline_parts_per_append

    assert parts(off) == 32 and parts(barrier) == 4
    assert parts(barrier) <= parts(best) <= parts(off)
    assert barrier.diff_bytes_per_append < off.diff_bytes_per_append


def test_hydrate_1x8_two_million_rows(tmp_path):
    run = run_cluster(
        tmp_path,
        5,
        groups=1,
        workers=8,
        mode="best-effort",
        workload="hydrate",
        snapshot_rows=2_000_000,
        rows_per_interval=1000,
    )
    print(json.dumps(_figures(run.stats)))
    stats = run.stats
    assert stats.verified is True and stats.rows == 2_004_000
    # interval 0 (250,000 rows, ~15 MB per worker) went through the workers' own batches
    assert run.records[0].own_batches == 8 and not run.records[0].shared_batches
    # a worker holds one interval's staged rows, not the snapshot
    assert stats.peak_rss["worker"] < 400 * MIB
    assert stats.peak_rss["builder"] < 200 * MIB
