"""Read a shard back and compare it with a workload's expected collection."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from ..persist.shard import Shard
from ..workloads import Workload


class Verification(msgspec.Struct, frozen=True):
    """Whether the shard at ``upper`` equals ``workload.expected(intervals)``
    exactly; ``detail`` says how it differs if not."""

    ok: bool
    intervals: int
    rows: int
    expected_rows: int
    detail: str = ""


def verify(shard: Shard, workload: Workload) -> Verification:
    """Compare the shard's collection as of its upper - 1 with what the
    workload's first ``upper // interval_ms`` intervals produce."""
    upper = shard.upper
    intervals = upper // workload.interval_ms
    # the snapshot first: its transient peak then holds nothing else
    actual = shard.snapshot() if upper else None
    expected = workload.expected(intervals)
    if actual is None:
        actual = expected.schema.empty_table()
    ok = actual.equals(expected)
    detail = "" if ok else difference(actual, expected)
    return Verification(ok, intervals, actual.num_rows, expected.num_rows, detail)


def difference(actual: pa.Table, expected: pa.Table) -> str:
    """How ``actual`` differs from ``expected``: schema, row count or the first differing row."""
    if not actual.schema.equals(expected.schema):
        return f"schema {actual.schema} differs from the expected {expected.schema}"
    if actual.num_rows != expected.num_rows:
        return f"{actual.num_rows} rows, expected {expected.num_rows}"
    for name in expected.column_names:
        unequal = pc.not_equal(actual[name], expected[name])
        first = pc.index(unequal, True).as_py()
        if first >= 0:
            return (
                f"row {first} differs in column {name!r}: {actual.slice(first, 1).to_pylist()} "
                f"vs expected {expected.slice(first, 1).to_pylist()}"
            )
    return "the tables differ"
