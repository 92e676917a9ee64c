"""An example workload (docs/workloads.md): orders with a string key and a
struct value of several columns, placed, then shipped (an update: the placed
row retracted, the shipped one inserted), then half of them deleted.

Interval ``i`` places orders ``i*R .. i*R+R-1``, ships the orders placed in
interval ``i-1`` and deletes the even ones shipped in interval ``i-1``
(placed in ``i-2``). Order ``n`` belongs to worker ``n % workers``. It has
no ``expected``: a run of it is verified by digest.

    shardsink up --workload examples/orders.py:Orders --config orders.toml

with ``orders.toml``::

    [workload]
    rows_per_interval = 500
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

VALUE = pa.struct([("status", pa.string()), ("amount", pa.float64()), ("qty", pa.int32())])


class Orders:
    """``rows_per_interval`` orders placed per interval (the cluster's, unless
    the ``[workload]`` table sets it)."""

    schema = pa.schema([("key", pa.string()), ("val", VALUE)])

    def __init__(self, rows_per_interval: int = 100) -> None:
        if rows_per_interval < 0:
            raise ValueError(f"rows_per_interval must be >= 0, got {rows_per_interval}")
        self.rows = rows_per_interval

    def updates(self, interval: int, worker: int, workers: int) -> pa.Table:
        placed = self._orders(interval, worker, workers)
        shipped = self._orders(interval - 1, worker, workers)
        deleted = self._orders(interval - 2, worker, workers)
        deleted = deleted[deleted % 2 == 0]
        parts = [
            (placed, "placed", 1),
            (shipped, "placed", -1),
            (shipped, "shipped", 1),
            (deleted, "shipped", -1),
        ]
        return pa.concat_tables([_rows(ids, status, diff) for ids, status, diff in parts])

    def _orders(self, interval: int, worker: int, workers: int) -> np.ndarray:
        if interval < 0:
            return np.empty(0, dtype=np.int64)
        lo, hi = interval * self.rows, (interval + 1) * self.rows
        return np.arange(lo + (worker - lo) % workers, hi, workers, dtype=np.int64)


def _rows(ids: np.ndarray, status: str, diff: int) -> pa.Table:
    n = len(ids)
    keys = pc.binary_join_element_wise(
        "order-", pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), 9, "0"), ""
    )
    val = pa.StructArray.from_arrays(
        [
            pa.array([status] * n, pa.string()),
            pa.array((ids % 1000) * 1.25, pa.float64()),
            pa.array(ids % 7 + 1, pa.int32()),
        ],
        fields=list(VALUE),
    )
    diffs = pa.array(np.full(n, diff, dtype=np.int64))
    return pa.table({"key": keys, "val": val, "diff": diffs})
