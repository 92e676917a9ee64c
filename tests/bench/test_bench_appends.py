"""``bench appends``: through the server, racing clients never lose a compare-and-set."""

from __future__ import annotations

import json

from shardsink.bench.appends import measure
from shardsink.process import ConsensusProcess
from shardsink.server.config import ServeConfig
from tests.helpers.cli import shardsink


def test_server_serializes_racing_clients(tmp_path) -> None:
    store = f"sqlite://{tmp_path}/c.db"
    blob = f"file://{tmp_path}/blob"
    with ConsensusProcess(store, blob, ServeConfig(bind=f"ipc://{tmp_path}/sock/c")) as server:
        via_server = measure(store, "server", server.address, blob, 4, 1.0)
    local = measure(store, "local", store, blob, 4, 1.0)
    assert via_server["appends"] > 0 and local["appends"] > 0
    assert via_server["cas_mismatches"] == 0


def test_many_shards_through_one_server_against_raw_cas(tmp_path) -> None:
    """``bench appends --shards``, short: every client appends to its shard
    (client i to shard i mod S), in a process of its own or sharing one with
    the others as a thread, the server loses no compare-and-set, raw
    compare-and-set runs on the same store, and the report, its figures and
    the plot are written."""
    out = tmp_path / "out"
    done = shardsink(
        "bench", "appends", "--store", f"sqlite://{tmp_path}/c.db", "--shards", "1,2",
        "--clients", "2", "--processes", "1,2", "--seconds", "1", "--out", str(out),
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    runs = [(r["shards"], r["clients"], r["processes"]) for r in results["runs"]]
    assert runs == [(1, 2, 1), (1, 2, 2), (2, 2, 1), (2, 2, 2)]
    for run in results["runs"]:
        assert run["appends"] > 0 and run["raw_per_s"] > 0
        assert run["cas_mismatches"] == 0 and run["raw_errors"] == 0
        assert run["server_cpu_ms"] >= run["loop_cpu_ms"] > 0
    assert (out / "appends.png").stat().st_size > 0
    assert "server/raw" in (out / "report.md").read_text()


def test_bench_appends_refuses_a_shard_without_a_client(tmp_path) -> None:
    done = shardsink(
        "bench", "appends", "--store", f"sqlite://{tmp_path}/c.db", "--shards", "4",
        "--clients", "2",
    )  # fmt: skip
    assert done.returncode != 0
    assert "every shard needs a client" in done.stderr
    assert "Traceback" not in done.stderr


def test_txn_measures_one_transaction_against_appends_apart(tmp_path) -> None:
    """``--txn``: the same intervals of S shards, one transaction each
    against S appends one after another, both appended and reported."""
    out = tmp_path / "out"
    done = shardsink(
        "bench", "appends", "--store", f"sqlite://{tmp_path}/c.db", "--shards", "3",
        "--seconds", "1", "--txn", "--out", str(out), timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    for mode in ("txn", "apart"):
        assert run[f"{mode}_per_s"] > 0 and run[f"{mode}_server_cpu_ms"] > 0
        assert run[f"{mode}_ms_p99"] >= run[f"{mode}_ms_p50"] > 0
    assert "one transaction of them all" in (out / "report.md").read_text()
