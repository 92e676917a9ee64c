"""The workloads of docs/architecture.md section 9, checked against a literal reading of it."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from shardsink.workloads import SCHEMA, Workload, values


def spec_updates(name: str, r: int, s: int, t: int, interval: int) -> Counter:
    """The spec, row by row: (key, val, ts) -> diff."""
    out: Counter = Counter()
    if name == "hydrate":
        ins = range(s) if interval == 0 else range(s + (interval - 1) * r, s + interval * r)
    else:
        ins = range(interval * r, (interval + 1) * r)
    for k in ins:
        out[(k, format(k, "032x"), interval * t)] += 1
    if name == "churn" and interval >= 2:
        for k in range((interval - 2) * r, (interval - 1) * r):
            out[(k, format(k, "032x"), interval * t)] -= 1
    return out


def as_counter(table: pa.Table) -> Counter:
    c: Counter = Counter()
    for row in table.to_pylist():
        c[(row["key"], row["val"], row["ts"])] += row["diff"]
    return c


@pytest.mark.parametrize("name", ["trickle", "churn", "hydrate"])
@pytest.mark.parametrize("n_workers", [1, 3, 8])
def test_workers_partition_each_interval_exactly(name: str, n_workers: int) -> None:
    w = Workload(name, rows_per_interval=10, snapshot_rows=25, interval_ms=7)
    for interval in range(5):
        merged: Counter = Counter()
        for worker in range(n_workers):
            part = w.updates(interval, worker, n_workers)
            assert part.schema == SCHEMA
            assert all(k % n_workers == worker for k in part.column("key").to_pylist())
            merged.update(as_counter(part))
        assert merged == spec_updates(name, 10, 25, 7, interval)


@pytest.mark.parametrize("name", ["trickle", "churn", "hydrate"])
@pytest.mark.parametrize("intervals", [0, 1, 2, 3, 6])
def test_expected_is_the_consolidated_sum(name: str, intervals: int) -> None:
    w = Workload(name, rows_per_interval=4, snapshot_rows=9, interval_ms=10)
    total: Counter = Counter()
    for i in range(intervals):
        for (k, v, _ts), d in spec_updates(name, 4, 9, 10, i).items():
            total[(k, v)] += d
    as_of = max(intervals * 10 - 1, 0)
    want = sorted((k, v, as_of, d) for (k, v), d in total.items() if d != 0)
    got = w.expected(intervals)
    assert [tuple(r.values()) for r in got.to_pylist()] == want


def test_values_match_python_formatting() -> None:
    import numpy as np

    keys = np.array([0, 1, 255, 2**40 + 7, 2**63 - 1], dtype=np.int64)
    assert values(keys).to_pylist() == [format(int(k), "032x") for k in keys]


def test_bad_shapes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown workload 'drizzle'"):
        Workload("drizzle", rows_per_interval=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rows_per_interval"):
        Workload("trickle", rows_per_interval=-1)
    with pytest.raises(ValueError, match="worker 3"):
        Workload("trickle", rows_per_interval=1).updates(0, 3, 3)
