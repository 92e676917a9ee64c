"""Read a shard back and check it: against the digests its batches were
written with, and against the workload's expected collection if it has one."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from .. import workloads
from ..persist.digest import Digest, comparable, digest, total_known
from ..persist.shard import Shard
from ..persist.state import ShardState


class Verification(msgspec.Struct, frozen=True):
    """Whether the shard at ``upper`` holds what the run wrote.

    Two checks, each independent of the other's data: every batch's parts
    hold the digest the batch was appended with (``digested`` batches;
    :mod:`shardsink.persist.digest`), and the snapshot read back equals what
    was written: for a workload with ``expected``, ``expected(intervals)``
    exactly (``exact``; ``expected_rows``); otherwise the digest of the
    snapshot, read through the shard's read path, equals the sum of the
    digests its writers recorded. A batch without a digest (``unverified``)
    leaves the second check unable to judge for a workload without
    ``expected``: then ``ok`` is false and ``detail`` says so. ``rows``: the
    snapshot's rows. ``detail`` says how it differs if not."""

    ok: bool
    intervals: int
    rows: int
    expected_rows: int | None = None
    detail: str = ""
    digested: int = 0
    unverified: int = 0
    exact: bool = False

    def how(self) -> str:
        """How the shard was checked (for a verification that passed)."""
        digests = f"{self.digested} batches match their digests"
        if self.exact:
            return f"equals the expected collection, {digests}"
        return f"by digest: the snapshot read back holds what was written, {digests}"


def verify(shard: Shard, workload: workloads.AnyWorkload, interval_ms: int) -> Verification:
    """Check the shard (see :class:`Verification`) as of its upper - 1,
    ``upper // interval_ms`` intervals of ``workload``."""
    # As of the upper of the state read here, not the latest: another writer
    # of the shard (a second cluster following as a replica) may append
    # meanwhile, and its rows lie at or past this upper.
    state = shard.state(refresh=True)
    upper = state.upper
    intervals = upper // interval_ms
    as_of = max(upper - 1, 0)
    report = shard.verify()
    problems = list(report.problems)
    if not hasattr(workload, "expected"):
        rows, problem = _against_digests(shard, state, as_of)
        if problem:
            problems.append(problem)
        return Verification(
            not problems,
            intervals,
            rows,
            None,
            "; ".join(problems),
            report.digested,
            report.unverified,
        )
    # the snapshot first: its transient peak then holds nothing else
    schema = shard.schema
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
        report.unverified,
        exact=True,
    )


def _against_digests(shard: Shard, state: ShardState, as_of: int) -> tuple[int, str]:
    """The rows of the snapshot as of ``as_of``, and what is wrong (``""``
    for nothing) when its digest, read back a batch at a time, is not the
    sum of the digests ``state``'s batches were written with."""
    written = total_known(b.digest for b in state.batches.values())
    if written is None or not comparable(written, shard.schema):
        missing = sum(
            1
            for b in state.batches.values()
            if b.digest is None or not comparable(b.digest, shard.schema)
        )
        return 0, (
            f"{missing} of {len(state.batches)} batches have no digest of this shard's hash "
            "scheme, and the workload has no expected collection: what the shard holds "
            "cannot be checked"
        )
    held, rows = Digest(), 0
    if state.upper:
        for batch in shard.batches(as_of):
            held = held + digest(batch)
            rows += batch.num_rows
    if held.same_content(written):
        return rows, ""
    return rows, (
        f"the snapshot read back holds {held.describe()}; its batches were written with "
        f"{written.describe()}"
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
