"""The peers write the same workloads in worker processes, read them back
exactly, and count what they cost; a commit a library gives up on is
counted and its rows are missed by the read-back."""

from __future__ import annotations

import threading

import pytest

from shardsink._histograms import Latencies
from shardsink.bench.peers import PEERS, format_named, harness as H, run_peer
from shardsink.bench.peers.wire import Outcome
from shardsink.workloads import Workload

#: Data files an interval writes, by peer, at 2x2 with rows for every worker.
FILES = {"per-worker": 4, "per-interval": 4, "coalesced": 1}


@pytest.mark.parametrize("mode", list(PEERS))
def test_every_peer_writes_reads_back_and_counts(tmp_path, mode: str) -> None:
    workload = Workload("churn", rows_per_interval=24, interval_ms=10)
    run = run_peer(mode, 2, 2, workload, 3, tmp_path / "t")
    commit = PEERS[mode].commit
    assert run["verified"] is True, run.get("error")
    assert run["appends"] == 3 and run["append_latency_ms"]["count"] == 3
    assert run["rows"] == sum(workload.updates(i).num_rows for i in range(3))
    assert run["files_per_interval"] == FILES[commit]
    assert run["commits"] == 3 * (4 if commit == "per-worker" else 1)
    assert run["commit_failures"] == 0 and run["metadata_bytes_per_interval"] > 0
    if commit != "per-worker":  # one committer: no race to lose, nothing left over
        assert run["commit_retries"] == 0 and run["orphan_files"] == 0
    # the read-back leaves no thread (pyiceberg's pool): the next cluster's zygote forks
    assert threading.active_count() == 1, threading.enumerate()


def test_a_peer_stops_releasing_intervals_past_its_budget(tmp_path) -> None:
    workload = Workload("trickle", rows_per_interval=8, interval_ms=10)
    run = run_peer("delta-coalesced", 1, 2, workload, 50, tmp_path / "t", budget_s=0.0)
    assert run["intervals"] == 50 and run["appends"] == 1  # the first is always written
    assert run["verified"] is True and run["rows"] == 8


def _race(committer, other, data) -> Outcome:
    """``committer`` appends ``data`` with ``other`` committing first."""
    other.append(data)
    return committer.append(data)


def test_a_delta_commit_that_fails_is_counted_and_its_rows_are_missed(tmp_path) -> None:
    delta = format_named("delta")
    workload = Workload("trickle", rows_per_interval=8, interval_ms=10)
    delta.create(tmp_path, retries=0)
    stale = delta.open(tmp_path, retries=0)  # delta-rs rebases a stale table only on a retry
    outcome = _race(stale, delta.open(tmp_path, retries=0), workload.updates(0))
    assert outcome.error.startswith("CommitFailedError")
    row = H._figures("delta-per-worker", 1, 2, workload, 2, delta.stored(tmp_path),
                     H.Writing(2, 16, [Outcome(), outcome], Latencies(), 1.0))  # fmt: skip
    assert row["commit_failures"] == 1 and row["verified"] is False
    assert row["orphan_files"] == 1  # the failed commit's data file
    assert row["error"] == (
        "the table read back holds 8 rows, the workload 16; 1 commit(s) failed, the first: "
        + outcome.error
    )
    retried = delta.open(tmp_path, retries=1)
    assert _race(retried, delta.open(tmp_path, retries=1), workload.updates(1)).error == ""


@pytest.mark.parametrize("budget", [0, 1])
def test_an_iceberg_commit_that_loses_a_race_is_retried_or_fails_counted(
    tmp_path, monkeypatch, budget: int
) -> None:
    iceberg = format_named("iceberg")
    workload = Workload("trickle", rows_per_interval=8, interval_ms=10)
    iceberg.create(tmp_path, retries=budget)
    ours, theirs = iceberg.open(tmp_path, budget), iceberg.open(tmp_path, budget)
    real = ours.catalog.commit_table
    raced: list[bool] = []

    def lost_once(table, requirements, updates):
        if not raced:  # another writer commits between our refresh and our commit
            raced.append(True)
            assert theirs.append(workload.updates(1)).error == ""
        return real(table, requirements, updates)

    monkeypatch.setattr(ours.catalog, "commit_table", lost_once)
    outcome = ours.append(workload.updates(0))
    stored = iceberg.stored(tmp_path)
    if budget:
        assert outcome == Outcome(retries=1) and stored.rows.num_rows == 16
        assert stored.commits == 2 and stored.orphans == 0
    else:
        assert outcome.retries == 0 and outcome.error.startswith("CommitFailedException")
        assert stored.rows.num_rows == 8 and stored.commits == 1
        assert stored.data_files == 2 and stored.orphans == 1  # the failed commit's data file


def test_a_peer_refuses_bad_input(tmp_path) -> None:
    workload = Workload("trickle", rows_per_interval=4)
    with pytest.raises(ValueError, match="unknown peer mode 'delta'; choose one of delta-per"):
        run_peer("delta", 1, 1, workload, 1, tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ValueError, match="is not empty"):
        run_peer("iceberg-coalesced", 1, 1, workload, 1, tmp_path / "full")
    with pytest.raises(ValueError, match="unknown table format 'hudi'"):
        format_named("hudi")
