"""Read a shard back and check it: against the digests its batches were
written with, and against the workload's expected collection if it has one."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from .. import workloads
from ..persist.shard import Shard


class Verification(msgspec.Struct, frozen=True):
    """Whether the shard at ``upper`` holds what the run wrote: every batch's
    parts match the digest it was appended with (``digested`` batches had
    one; :mod:`shardsink.persist.digest`) and, for a workload with
    ``expected``, the collection equals ``expected(intervals)`` exactly
    (``rows``/``expected_rows``: the collection's, else the sums of diffs
    held and written). ``detail`` says how it differs if not."""

    ok: bool
    intervals: int
    rows: int
    expected_rows: int
    detail: str = ""
    digested: int = 0
    exact: bool = False

    def how(self) -> str:
        """How the shard was checked (for a verification that passed)."""
        digests = f"{self.digested} batches match their digests"
        return (
            f"equals the expected collection, {digests}" if self.exact else f"by digest: {digests}"
        )


def verify(shard: Shard, workload: workloads.AnyWorkload, interval_ms: int) -> Verification:
    """Check the shard (see :class:`Verification`) as of its upper - 1,
    ``upper // interval_ms`` intervals of ``workload``."""
    upper = shard.upper
    intervals = upper // interval_ms
    report = shard.verify()
    problems = list(report.problems)
    schema = shard.schema
    if not hasattr(workload, "expected"):
        batches = shard.state(refresh=False).batches.values()
        diffs = sum(b.digest.diffs for b in batches if b.digest is not None)
        detail = "; ".join(problems)
        return Verification(report.ok, intervals, diffs, diffs, detail, report.digested)
    # the snapshot first: its transient peak then holds nothing else. As of
    # the upper read above, not the latest: another writer of the shard (a
    # second cluster following as a replica) may have appended since.
    as_of = max(upper - 1, 0)
    actual = shard.snapshot(as_of) if upper else schema.empty_table()
    expected = workloads.expected(workload, schema, intervals, as_of)
    assert expected is not None
    if not actual.equals(expected):
        problems.append(difference(actual, expected))
    return Verification(
        not problems,
        intervals,
        actual.num_rows,
        expected.num_rows,
        "; ".join(problems),
        report.digested,
        exact=True,
    )


def difference(actual: pa.Table, expected: pa.Table) -> str:
    """How ``actual`` differs from ``expected``: schema, row count or the first differing row."""
    if not actual.schema.equals(expected.schema):
        return f"schema {actual.schema} differs from the expected {expected.schema}"
    if actual.num_rows != expected.num_rows:
        return f"{actual.num_rows} rows, expected {expected.num_rows}"
    for name in expected.column_names:
        if pa.types.is_struct(expected.schema.field(name).type):
            continue  # Arrow compares no structs; the other columns or the rows say it
        unequal = pc.not_equal(actual[name], expected[name])
        first = pc.index(unequal, True).as_py()
        if first >= 0:
            return (
                f"row {first} differs in column {name!r}: {actual.slice(first, 1).to_pylist()} "
                f"vs expected {expected.slice(first, 1).to_pylist()}"
            )
    return "the tables differ"
