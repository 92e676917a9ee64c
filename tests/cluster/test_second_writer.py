"""Two clusters writing one shard through one consensus server: the second
follows as a replica (an interval the other appended first is skipped), so
both end with the last interval and the shard holds every interval once."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from shardsink import open_shard
from shardsink._curve import KEYS_ENV
from shardsink.cluster import Workload
from shardsink.cluster.verify import verify
from shardsink.process import ConsensusProcess
from shardsink.server.config import ServeConfig
from shardsink.workloads import SCHEMA

ROOT = Path(__file__).resolve().parents[2]
INTERVALS = 60
INTERVAL_MS = 100
ROWS = 100


def test_two_clusters_on_one_shard_end_together_and_append_each_interval_once(
    tmp_path, popen, monkeypatch
):
    blob = f"file://{tmp_path / 'blob'}"
    store = f"sqlite://{tmp_path / 'consensus.db'}"
    monkeypatch.setenv(KEYS_ENV, str(tmp_path / "keys"))  # the server's CURVE keys, for all
    with ConsensusProcess(store, blob, ServeConfig(bind="tcp://127.0.0.1:0")) as server:
        argv = [
            sys.executable, "-m", "shardsink.cli", "up", "--json",
            "--consensus", server.address, "--blob", blob,
            "--groups", "1", "--workers", "2", "--workload", "churn",
            "--rows-per-interval", str(ROWS), "--intervals", str(INTERVALS),
            "--interval-ms", str(INTERVAL_MS), "--pace", "realtime",
        ]  # fmt: skip
        outputs = [(tmp_path / f"out{i}", tmp_path / f"err{i}") for i in range(2)]
        procs = []
        for i, (out, err) in enumerate(outputs):
            with out.open("w") as stdout, err.open("w") as stderr:
                procs.append(
                    popen(
                        [*argv, "--data-dir", str(tmp_path / f"d{i}")],
                        env={**os.environ, "PYTHONPATH": str(ROOT)},
                        stdout=stdout,
                        stderr=stderr,
                    )
                )
        # 60 intervals take 6 s of wall clock; a follower that retries a lost
        # append for minutes misses this by far
        deadline = time.monotonic() + 45
        ended: dict[int, float] = {}
        while len(ended) < 2:
            for i, proc in enumerate(procs):
                if i not in ended and proc.poll() is not None:
                    ended[i] = time.monotonic()
            if time.monotonic() > deadline:
                logs = [outputs[i][1].read_text()[-3000:] for i in range(2) if i not in ended]
                pytest.fail(f"still running after 45 s: {logs}")
            time.sleep(0.05)
        for proc, (_, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, err.read_text()
        results = [json.loads(out.read_text()) for out, _ in outputs]
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
