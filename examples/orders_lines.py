"""An example workload of two shards (docs/workloads.md, Several shards):
orders and their lines, every line pointing to an order that exists.

Interval ``i`` places orders ``i*R .. i*R+R-1`` (``R`` =
``rows_per_interval``), each with ``1 + k % 3`` lines; the next interval
ships them (an update of the order's status, the first line's quantity
doubled, and the last line of an order ``k % 5 == 1`` with several lines
deleted; the order's total follows its lines); the one after deletes the
orders ``k % 4 == 0``, with all their lines. Order ``k`` and its lines
belong to worker ``k % workers``, so one worker writes an order and its
lines in the same interval, and the cluster appends both shards of an
interval in one transaction: a snapshot of both as of one time never holds
a line without its order, nor an order whose total is not its lines'.
``check`` says so of every snapshot read back; ``expected`` is exact, a
model written in plain Python.

    shardsink up --workload examples/orders_lines.py:OrdersLines --intervals 12
    shardsink export --data-dir shardsink-data --shard orders --shard lines --output snap
"""

from __future__ import annotations

import pyarrow as pa

ORDER = pa.struct([("customer", pa.string()), ("status", pa.string()), ("total", pa.int64())])
LINE = pa.struct(
    [("order", pa.int64()), ("sku", pa.string()), ("qty", pa.int32()), ("price", pa.int64())]
)
#: An order changes in the interval it is placed and the two after it.
AGES = 3


class OrdersLines:
    """``rows_per_interval`` orders placed per interval (the cluster's, unless
    the ``[workload]`` table sets it)."""

    shards = {
        "orders": pa.schema([("key", pa.int64()), ("val", ORDER)]),
        "lines": pa.schema([("key", pa.string()), ("val", LINE)]),
    }

    def __init__(self, rows_per_interval: int = 100) -> None:
        if rows_per_interval < 0:
            raise ValueError(f"rows_per_interval must be >= 0, got {rows_per_interval}")
        self.rows = rows_per_interval

    def updates(self, interval: int, worker: int, workers: int) -> dict[str, pa.Table]:
        """What changed for worker ``worker``'s orders placed in the last
        :data:`AGES` intervals: the rows of their state before this interval
        retracted, those of their state now inserted."""
        out: dict[str, list[tuple]] = {"orders": [], "lines": []}
        lo = max(interval - AGES + 1, 0) * self.rows
        first = lo + (worker - lo) % workers
        for k in range(first, (interval + 1) * self.rows, workers):
            age = interval - k // self.rows
            before, now = model(k, age - 1), model(k, age)
            for shard in out:
                gone, new = before[shard], now[shard]
                out[shard] += [(key, val, -1) for key, val in gone.items() if new.get(key) != val]
                out[shard] += [(key, val, 1) for key, val in new.items() if gone.get(key) != val]
        return {shard: _table(shard, rows) for shard, rows in out.items()}

    def expected(self, intervals: int) -> dict[str, pa.Table]:
        """The model: every order placed in the first ``intervals`` intervals,
        as it is after the last of them."""
        out: dict[str, list[tuple]] = {"orders": [], "lines": []}
        for k in range(intervals * self.rows):
            now = model(k, intervals - 1 - k // self.rows)
            for shard in out:
                out[shard] += [(key, val, 1) for key, val in now[shard].items()]
        return {shard: _table(shard, rows) for shard, rows in out.items()}

    def check(self, snapshots: dict[str, pa.Table]) -> str | None:
        """Every line's order exists, and every order's total is the sum of
        its lines' (``None``); else the first few that do not."""
        orders = {row["key"]: row["val"] for row in snapshots["orders"].to_pylist()}
        totals: dict[int, int] = {}
        problems = []
        for row in snapshots["lines"].to_pylist():
            line = row["val"]
            if line["order"] not in orders:
                problems.append(f"line {row['key']} points to order {line['order']}, not there")
            totals[line["order"]] = totals.get(line["order"], 0) + line["qty"] * line["price"]
        for key, order in orders.items():
            if order["total"] != totals.get(key, 0):
                problems.append(
                    f"order {key} totals {order['total']}, its lines {totals.get(key, 0)}"
                )
        if not problems:
            return None
        return "; ".join(problems[:3]) + (f" ({len(problems)} in all)" if len(problems) > 3 else "")


def model(k: int, age: int) -> dict[str, dict]:
    """Order ``k`` and its lines ``age`` intervals after it was placed (by
    shard, key -> value; nothing before it is placed or once it is deleted)."""
    if age < 0 or (age >= 2 and k % 4 == 0):
        return {"orders": {}, "lines": {}}
    shipped = age >= 1
    count = 1 + k % 3
    if shipped and k % 5 == 1 and count > 1:
        count -= 1  # its last line was deleted when it shipped
    lines = {}
    for j in range(count):
        qty = (j + 1) * (2 if shipped and j == 0 else 1)
        lines[f"{k:010d}-{j}"] = {
            "order": k,
            "sku": f"sku-{(k * 7 + j) % 97:02d}",
            "qty": qty,
            "price": 100 + (k * 7 + j * 13) % 900,
        }
    order = {
        "customer": f"c{k % 37}",
        "status": "shipped" if shipped else "placed",
        "total": sum(line["qty"] * line["price"] for line in lines.values()),
    }
    return {"orders": {k: order}, "lines": lines}


def _table(shard: str, rows: list[tuple]) -> pa.Table:
    schema = OrdersLines.shards[shard]
    keys, vals, diffs = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table(
        {
            "key": pa.array(keys, schema.field("key").type),
            "val": pa.array(vals, schema.field("val").type),
            "diff": pa.array(diffs, pa.int64()),
        }
    )
