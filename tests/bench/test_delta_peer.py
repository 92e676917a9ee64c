"""The Delta Lake peer writes the same workloads and reads them back exactly."""

from __future__ import annotations

import pytest

from shardsink.bench.delta_peer import run_delta
from shardsink.workloads import Workload


@pytest.mark.parametrize("name", ["trickle", "churn"])
def test_delta_peer_modes_verify_and_count(tmp_path, name: str) -> None:
    workload = Workload(name, rows_per_interval=24, interval_ms=10)
    per_worker = run_delta("delta-per-worker", 2, 3, workload, 4, tmp_path / "a")
    per_interval = run_delta("delta-per-interval", 2, 3, workload, 4, tmp_path / "b")
    for run in (per_worker, per_interval):
        assert run["verified"] is True
        assert run["files_per_interval"] == 6  # every one of the 6 writers has rows
        assert run["rows"] == sum(workload.updates(i).num_rows for i in range(4))
    assert per_worker["commits"] == 4 * 6
    assert per_interval["commits"] == 4
    assert per_interval["commit_bytes_per_interval"] < per_worker["commit_bytes_per_interval"]


def test_delta_peer_refuses_bad_input(tmp_path) -> None:
    workload = Workload("trickle", rows_per_interval=4)
    with pytest.raises(ValueError, match="unknown Delta peer mode 'delta'"):
        run_delta("delta", 1, 1, workload, 1, tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ValueError, match="is not empty"):
        run_delta("delta-per-worker", 1, 1, workload, 1, tmp_path / "full")
