"""Read a shard back and check it: against the digests its batches were
written with, and against the workload's expected collection if it has one;
and a workload's shards together, as of one time, with its own ``check``."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from .. import workloads
from ..persist import Digest, Shard, ShardState, at_one_upper, comparable, digest, total_known


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
    snapshot's rows. ``detail`` says how it differs if not.

    Of a workload's shards together (:func:`verify_shards`): each shard so
    checked (the figures summed; ``exact`` if every one was), all as of one
    upper, and the snapshots of all of them given to the workload's
    ``check`` (``checked``: it ran). ``shards``: their names, when several."""

    ok: bool
    intervals: int
    rows: int
    expected_rows: int | None = None
    detail: str = ""
    digested: int = 0
    unverified: int = 0
    exact: bool = False
    checked: bool = False
    shards: tuple[str, ...] = ()

    def how(self) -> str:
        """How the shard was checked (for a verification that passed)."""
        digests = f"{self.digested} batches match their digests"
        several = len(self.shards) > 1
        if self.exact:
            what = (
                f"each of {', '.join(self.shards)} equals its expected collection"
                if several
                else "equals the expected collection"
            )
        else:
            what = "by digest: the snapshot read back holds what was written"
            if several:
                what = f"by digest: each of {', '.join(self.shards)} holds what was written"
        checked = ", the workload's check holds" if self.checked else ""
        return f"{what}, {digests}{checked}"


def verify(
    shard: Shard,
    workload: workloads.AnyWorkload,
    interval_ms: int,
    *,
    state: ShardState | None = None,
) -> Verification:
    """Check the shard (see :class:`Verification`) as of its upper - 1,
    ``upper // interval_ms`` intervals of ``workload`` (of its shard of
    ``shard``'s name, for a workload of several); the upper of ``state``,
    the shard's latest when not given."""
    return _verify(shard, workload, interval_ms, state)[0]


def verify_shards(
    shards: Mapping[str, Shard], workload: workloads.AnyWorkload, interval_ms: int
) -> Verification:
    """Check every shard of ``workload`` (``shards`` by name) as :func:`verify`
    does, all as of one upper (their states are read until they agree: a
    transaction moves them together), and give their snapshots as of it to
    the workload's ``check``. One shard of a workload without ``check`` is
    exactly :func:`verify`. Shards whose uppers keep differing fail it."""
    states = at_one_upper(shards)
    if states is None:
        uppers = {name: shard.state(refresh=False).upper for name, shard in shards.items()}
        return Verification(False, 0, 0, detail=f"the shards' uppers differ: {uppers}")
    upper = next(iter(states.values())).upper
    # of several, one call of the workload's model for all (a model may be
    # slow); of one, the snapshot is read first, its peak holding nothing else
    schemas = {name: shard.schema for name, shard in shards.items()}
    models = (
        workloads.expected_shards(workload, schemas, upper // interval_ms, max(upper - 1, 0))
        if len(shards) > 1
        else None
    )
    checked = {
        name: _verify(shard, workload, interval_ms, states[name], (models or {}).get(name))
        for name, shard in shards.items()
    }
    has_check = getattr(workload, "check", None) is not None
    if len(shards) == 1 and not has_check:
        return next(iter(checked.values()))[0]
    problems = [f"shard {name}: {v.detail}" for name, (v, _) in checked.items() if not v.ok]
    if has_check:
        snapshots = {
            name: table if table is not None else _snapshot(shards[name], upper)
            for name, (_, table) in checked.items()
        }
        found = workloads.check(workload, snapshots)
        if found is not None:
            problems.append(f"the workload's check as of {max(upper - 1, 0)}: {found}")
    results = [v for v, _ in checked.values()]
    expected = [v.expected_rows for v in results]
    return Verification(
        not problems,
        upper // interval_ms,
        sum(v.rows for v in results),
        sum(e for e in expected if e is not None) if None not in expected else None,
        "; ".join(problems),
        sum(v.digested for v in results),
        sum(v.unverified for v in results),
        exact=all(v.exact for v in results),
        checked=has_check,
        shards=tuple(shards),
    )


def _verify(
    shard: Shard,
    workload: workloads.AnyWorkload,
    interval_ms: int,
    state: ShardState | None,
    expected: pa.Table | None = None,
) -> tuple[Verification, pa.Table | None]:
    """:func:`verify`, and the snapshot it read whole (``None`` when it
    checked by digest, a batch at a time); ``expected``: the shard's
    expected collection as of the state's upper, if already made."""
    # As of the upper of the state read here, not the latest: another writer
    # of the shard (a second cluster following as a replica) may append
    # meanwhile, and its rows lie at or past this upper.
    state = state if state is not None else shard.state(refresh=True)
    upper = state.upper
    intervals = upper // interval_ms
    as_of = max(upper - 1, 0)
    report = shard.verify()
    problems = list(report.problems)
    if not hasattr(workload, "expected"):
        rows, problem = _against_digests(shard, state, as_of)
        if problem:
            problems.append(problem)
        verification = Verification(
            not problems,
            intervals,
            rows,
            None,
            "; ".join(problems),
            report.digested,
            report.unverified,
        )
        return verification, None
    # the snapshot first: its transient peak then holds nothing else
    actual = _snapshot(shard, upper)
    if expected is None:
        expected = workloads.expected(workload, shard.schema, intervals, as_of, shard.name)
    assert expected is not None
    if not actual.equals(expected):
        problems.append(difference(actual, expected))
    verification = Verification(
        not problems,
        intervals,
        actual.num_rows,
        expected.num_rows,
        "; ".join(problems),
        report.digested,
        report.unverified,
        exact=True,
    )
    return verification, actual


def _snapshot(shard: Shard, upper: int) -> pa.Table:
    """The shard's consolidated snapshot as of ``upper - 1`` (empty at 0)."""
    return shard.snapshot(upper - 1) if upper else shard.schema.empty_table()


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
            held = held + digest.digest(batch)
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
