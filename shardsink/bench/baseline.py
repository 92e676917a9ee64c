"""What plain pyarrow does on this machine: the baseline bulk writes are
measured against.

:func:`measure` starts ``processes`` fresh interpreters that each generate
their share of a workload's interval (the same rows a cluster's workers
write: global worker ``w`` of ``N`` owns keys ``k % N == w``), write them as
Parquet (pyarrow's defaults, one file per ``part_rows`` rows) and store
each file into the blob store with its ``set`` (atomic and durable: fsync'd
on ``file://``), released together once all are ready. The wall time is
the slowest process's, from its release to its last file stored; rows/s is
every row over it.
Nothing of shardsink's runs in between: no consolidation, no shared memory,
no consensus. A bulk figure is reported as a fraction of it, measured in the
same run (``bench cluster``'s hydrate section).
"""

from __future__ import annotations

import io
import os
import time
import uuid

import msgspec

from ..storage import BLOB_ENV
from . import clients as racing

#: Rows per Parquet file a baseline process writes: a hydrate's parts are of
#: about this many rows at the default 64 MiB blob target (48-byte rows).
PART_ROWS = 1 << 20


class BaselineProcess(msgspec.Struct, forbid_unknown_fields=True):
    """A baseline process's payload: worker ``worker`` of ``workers`` writes
    its share of ``rows`` under ``prefix``, ``part_rows`` rows a file."""

    prefix: str
    worker: int
    workers: int
    rows: int
    part_rows: int


def _process(payload: BaselineProcess) -> None:
    """One baseline process (see :mod:`shardsink.bench.clients`); the blob
    URI comes in the environment (``BLOB_ENV``)."""
    import pyarrow.parquet as pq

    from ..storage import open_blob
    from ..workloads import Workload

    prefix, worker, part_rows = payload.prefix, payload.worker, payload.part_rows
    blob = open_blob(os.environ[BLOB_ENV])
    workload = Workload("hydrate", rows_per_interval=0, snapshot_rows=payload.rows)
    try:
        if not racing.ready():
            return
        started = time.perf_counter()
        table = workload.updates(0, worker, payload.workers)
        generated = time.perf_counter()
        written = 0
        for n, start in enumerate(range(0, len(table), part_rows)):
            sink = io.BytesIO()
            pq.write_table(table.slice(start, part_rows), sink)
            blob.set(f"{prefix}/w{worker}-{n:05d}.parquet", sink.getvalue())
            written += sink.tell()
        done = time.perf_counter()
        racing.report(
            {
                "rows": len(table),
                "bytes": written,
                "generate_s": generated - started,
                "write_s": done - generated,
                "seconds": done - started,
            }
        )
    finally:
        blob.close()


def measure(blob: str, rows: int, processes: int, part_rows: int = PART_ROWS) -> dict:
    """The baseline: ``processes`` processes writing the ``rows`` of a
    hydrate's snapshot into ``blob`` (under ``baseline-<id>/``, deleted
    afterwards). ``ValueError`` for fewer than one process or row."""
    from ..storage import open_blob

    if processes < 1 or rows < 1 or part_rows < 1:
        raise ValueError(
            f"a baseline needs processes, rows and part_rows >= 1, got {processes}, {rows}, "
            f"{part_rows}"
        )
    prefix = f"baseline-{uuid.uuid4().hex[:8]}"
    try:
        reports = racing.race(
            "shardsink.bench.baseline:_process",
            [BaselineProcess(prefix, w, processes, rows, part_rows) for w in range(processes)],
            3600.0,
            f"the pyarrow baseline of {rows:,} rows",
            env={BLOB_ENV: blob},
        )
    finally:
        store = open_blob(blob)
        try:
            for key in list(store.list(f"{prefix}/")):
                store.delete(key)
        finally:
            store.close()
    written = sum(r["rows"] for r in reports)
    wall_s = max(r["seconds"] for r in reports)  # released together: the slowest one's
    return {
        "processes": processes,
        "rows": written,
        "bytes": sum(r["bytes"] for r in reports),
        "wall_s": wall_s,
        "rows_per_s": written / wall_s,
        "generate_s_max": max(r["generate_s"] for r in reports),
        "write_s_max": max(r["write_s"] for r in reports),
    }
