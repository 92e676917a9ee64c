"""Two writer processes race compare-and-append for the same intervals, on
the real SQLite and PostgreSQL engines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from race_writer import ROWS

from shardsink.persist import open_shard

N = 60
SCRIPT = Path(__file__).with_name("race_writer.py")


def race(blob: str, consensus: str) -> list[dict]:
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), blob, consensus, str(N), f"writer-{k}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:  # both start appending at once
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0]
        return [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def check(blob: str, consensus: str) -> None:
    a, b = race(blob, consensus)
    assert sorted(a["won"] + b["won"]) == list(range(N))  # each interval exactly once
    for who in (a, b):
        for expected, actual in who["mismatches"]:
            assert actual > expected
    with open_shard("race", blob=blob, consensus=consensus, create=False) as shard:
        assert shard.upper == N
        snap = shard.reader().snapshot()
        keys = list(range(N * ROWS))
        assert snap["key"].to_pylist() == keys
        assert snap["val"].to_pylist() == [format(k, "032x") for k in keys]
        assert set(snap["diff"].to_pylist()) == {1}
        assert set(snap["ts"].to_pylist()) == {N - 1}
        assert sum(b.rows for b in shard.state().batches.values()) == N * ROWS


def test_two_writer_processes_race_on_sqlite(tmp_path):
    check(f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/consensus.db")


@pytest.mark.postgres
def test_two_writer_processes_race_on_postgres(tmp_path, postgres_server):
    check(f"file://{tmp_path}/blob", postgres_server.new_database())
