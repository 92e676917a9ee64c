"""An example workload (docs/workloads.md) of the shapes people write: a
sensor's latest reading, an int64 key and a struct value holding a
timestamp, a float, a nullable string and a list of ints, updated and
deleted as intervals go, with an exact ``expected`` written in plain Python
(a model of what the shard must hold).

Sensor ``k`` (``0 .. rows_per_interval - 1``) belongs to worker
``k % workers``. In interval ``i`` a sensor is live unless ``(k + i) % 5 ==
0``; a live sensor's reading changes every interval whose number ``(k + i)``
is even, and stays the same otherwise. An interval retracts a sensor's
reading of interval ``i - 1`` that is gone or changed, and inserts its new
one: updates (a retraction and an insertion), deletes (a retraction alone)
and inserts after a delete.

    shardsink up --workload examples/readings.py:Readings --intervals 12
"""

from __future__ import annotations

import datetime

import pyarrow as pa

VALUE = pa.struct(
    [
        ("at", pa.timestamp("ms")),
        ("value", pa.float64()),
        ("note", pa.string()),  # null for most readings
        ("samples", pa.list_(pa.int32())),
    ]
)
EPOCH = datetime.datetime(2026, 1, 1)


class Readings:
    """``rows_per_interval`` sensors (the cluster's, unless the
    ``[workload]`` table sets it)."""

    schema = pa.schema([("key", pa.int64()), ("val", VALUE)])

    def __init__(self, rows_per_interval: int = 100) -> None:
        if rows_per_interval < 1:
            raise ValueError(f"rows_per_interval must be >= 1, got {rows_per_interval}")
        self.sensors = rows_per_interval

    def updates(self, interval: int, worker: int, workers: int) -> pa.Table:
        rows = []
        for k in range(worker, self.sensors, workers):
            before = reading(k, interval - 1) if interval else None
            now = reading(k, interval)
            if before != now:
                if before is not None:
                    rows.append((k, before, -1))
                if now is not None:
                    rows.append((k, now, 1))
        return _table(rows)

    def expected(self, intervals: int) -> pa.Table:
        """The model: every sensor live after ``intervals`` intervals, with
        its reading then."""
        last = intervals - 1
        rows = [(k, reading(k, last), 1) for k in range(self.sensors) if reading(k, last)]
        return _table(rows)


def reading(k: int, interval: int) -> dict | None:
    """Sensor ``k``'s reading in ``interval`` (``None``: it is deleted)."""
    if interval < 0 or (k + interval) % 5 == 0:
        return None
    changed = interval - (k + interval) % 2  # the last interval whose reading it kept
    return {
        "at": EPOCH + datetime.timedelta(milliseconds=1000 * changed + k),
        "value": k / 8 + changed,
        "note": f"recalibrated at {changed}" if (k + changed) % 7 == 0 else None,
        "samples": [k % 5, changed, -(k % 3)][: 1 + (k + changed) % 3],
    }


def _table(rows: list[tuple[int, dict, int]]) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([k for k, _, _ in rows], pa.int64()),
            "val": pa.array([v for _, v, _ in rows], VALUE),
            "diff": pa.array([d for _, _, d in rows], pa.int64()),
        }
    )
