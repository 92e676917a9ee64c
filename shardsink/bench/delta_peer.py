"""The Delta Lake peer: the same workloads written with the ``deltalake`` package.

Two ways to write an interval, both on the same machine as the shardsink runs:

- ``delta-per-worker``: every worker appends its own slice with
  ``write_deltalake`` (one file and one commit per worker with rows), the
  naive shape shardsink's coalescing replaces;
- ``delta-per-interval``: every worker writes its slice as a Parquet file
  into the table, then the coordinator commits all of the interval's files
  in one transaction (one commit per interval, one file per worker).

Workers are threads (``deltalake`` and pyarrow release the GIL while they
write), released together for each interval. The table is read back,
consolidated and compared with the workload's expected collection. Figures
use the field names of docs/architecture.md section 10 (Metrics and benchmark
output) where they mean the same thing: ``blob_puts`` are data files
written, ``diff_bytes_per_append`` is commit-log (``_delta_log/*.json``) bytes
per interval.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..persist import parts as P
from ..workloads import Workload

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

MODES = ("delta-per-worker", "delta-per-interval")


def run_delta(
    mode: str, groups: int, workers: int, workload: Workload, intervals: int, table_dir: Path
) -> dict:
    """Write ``intervals`` intervals of ``workload`` with ``groups * workers``
    writers into a new Delta table at ``table_dir``; return the run's figures."""
    from deltalake import write_deltalake

    if mode not in MODES:
        raise ValueError(f"unknown Delta peer mode {mode!r}; choose one of {', '.join(MODES)}")
    if table_dir.exists() and any(table_dir.iterdir()):
        raise ValueError(f"Delta table directory {table_dir} is not empty")
    schema = P.full_schema()
    # the table exists before the first interval, as a shard does
    write_deltalake(str(table_dir), schema.empty_table(), mode="append")
    written = _write_intervals(mode, groups * workers, workload, intervals, table_dir, schema)
    return _figures(mode, groups, workers, workload, intervals, table_dir, schema, written)


class _Written(NamedTuple):
    """What writing the intervals did: data files and rows written, each
    interval's latency (slices made, written and committed), the wall time."""

    files: int
    rows: int
    latencies_ms: list[float]
    wall_s: float


def _write_intervals(
    mode: str, n: int, workload: Workload, intervals: int, table_dir: Path, schema: pa.Schema
) -> _Written:
    """Write every interval into the table at ``table_dir`` with ``n``
    writer threads, the way ``mode`` says (see the module)."""
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    uri = str(table_dir)
    files = rows = 0
    # concurrent blind appends conflict and retry; with 32 writers the default
    # budget (15) runs out, which would measure the retry limit, not Delta
    retrying = CommitProperties(max_commit_retries=10_000)
    latencies_ms: list[float] = []

    def slice_of(i: int, w: int) -> pa.Table:
        return workload.updates(i, w, n)

    started = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        for i in range(intervals):
            t0 = time.perf_counter()
            slices = [t for t in pool.map(lambda w, i=i: slice_of(i, w), range(n)) if t.num_rows]
            if mode == "delta-per-worker":
                list(
                    pool.map(
                        lambda t: write_deltalake(
                            uri, t, mode="append", commit_properties=retrying
                        ),
                        slices,
                    )
                )
                files += len(slices)
            else:
                actions = list(pool.map(lambda t: _write_file(table_dir, t), slices))
                if actions:
                    DeltaTable(uri).create_write_transaction(actions, "append", schema)
                files += len(actions)
            rows += sum(t.num_rows for t in slices)
            latencies_ms.append((time.perf_counter() - t0) * 1000)
    return _Written(files, rows, latencies_ms, time.perf_counter() - started)


def _write_file(table_dir: Path, table: pa.Table) -> AddAction:
    """Write ``table`` as a new Parquet file in ``table_dir``; the action
    that adds it to the table (``delta-per-interval``)."""
    from deltalake.transaction import AddAction

    name = f"part-{uuid.uuid4().hex}.parquet"
    pq.write_table(table, table_dir / name)
    size = (table_dir / name).stat().st_size
    return AddAction(name, size, {}, int(time.time() * 1000), True, _stats(table))


def _figures(
    mode: str,
    groups: int,
    workers: int,
    workload: Workload,
    intervals: int,
    table_dir: Path,
    schema: pa.Schema,
    written: _Written,
) -> dict:
    """The run's figures (results.json's fields, see the module), the table
    read back and compared with the workload's expected collection."""
    from deltalake import DeltaTable

    file_bytes = sum(p.stat().st_size for p in table_dir.glob("*.parquet"))
    log = sorted((table_dir / "_delta_log").glob("*.json"))
    commits = log[1:]  # version 0 created the empty table
    commit_bytes = sum(p.stat().st_size for p in commits)
    stored = P.conform(DeltaTable(str(table_dir)).to_pyarrow_table(), schema)
    verified = P.at_time(stored, _as_of(workload, intervals)).equals(workload.expected(intervals))
    per = max(intervals, 1)
    files, rows, latencies_ms, wall_s = written
    return {
        "mode": mode,
        "groups": groups,
        "workers": workers,
        "workload": workload.name,
        "rows_per_interval": workload.rows_per_interval,
        "intervals": intervals,
        "snapshot_rows": workload.snapshot_rows,
        "shared_max_bytes": 0,
        "appends": intervals,
        "cas_per_append": len(commits) / per,
        "commits": len(commits),
        "blob_puts": files,
        "blob_put_bytes": file_bytes,
        "files_per_interval": files / per,
        "data_parts_per_append": files / per,
        "inline_parts_per_append": 0.0,
        "inline_bytes_per_append": 0.0,
        "diff_bytes_per_append": commit_bytes / per,
        "commit_bytes_per_interval": commit_bytes / per,
        "rows": rows,
        "wall_s": wall_s,
        "rows_per_s": rows / wall_s if wall_s else 0.0,
        "append_latency_ms_p50": float(np.percentile(latencies_ms, 50)) if latencies_ms else 0.0,
        "append_latency_ms_p99": float(np.percentile(latencies_ms, 99)) if latencies_ms else 0.0,
        "verified": bool(verified),
    }


def _as_of(workload: Workload, intervals: int) -> int:
    return max(intervals * workload.interval_ms - 1, 0)


def _stats(table: pa.Table) -> str:
    """Delta file statistics (row count, min/max of key and ts, null counts)."""
    columns = ("key", "ts")
    mins = {c: pc.min(table[c]).as_py() for c in columns}
    maxs = {c: pc.max(table[c]).as_py() for c in columns}
    return json.dumps(
        {
            "numRecords": table.num_rows,
            "minValues": mins,
            "maxValues": maxs,
            "nullCount": {c: 0 for c in table.column_names},
        }
    )
