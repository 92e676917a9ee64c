"""Builders shared by the shard tests: update tables, batches, store URIs."""

from __future__ import annotations

import uuid

import pyarrow as pa

from shardsink.persist import spine
from shardsink.persist.commands import Command, ExpireWriter, Result
from shardsink.persist.compaction import CompactionReport, merge_runs
from shardsink.persist.maintenance import register_writer
from shardsink.persist.parts import full_schema
from shardsink.persist.state import Batch, BlobPart, InlinePart, ShardState, part_prefix
from shardsink.persist.stats import ShardStats
from shardsink.persist.transitions import initial_state, step

SCHEMA = full_schema()


def updates(rows: list[tuple[int, str, int, int]]) -> pa.Table:
    """An update table of ``(key, val, ts, diff)`` rows in the default schema."""
    columns = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, SCHEMA, strict=True)], schema=SCHEMA
    )


def interval_rows(i: int, keys, diff: int = 1) -> pa.Table:
    """Rows of the trickle workload for interval ``i`` (ts = i)."""
    return updates([(k, format(k, "032x"), i, diff) for k in keys])


def rows_of(table: pa.Table) -> list[tuple]:
    return [(r["key"], r["val"], r["ts"], r["diff"]) for r in table.to_pylist()]


def memory_stores() -> tuple[str, str]:
    name = uuid.uuid4().hex
    return f"memory://b-{name}", f"memory://c-{name}"


def s0(inline_max_bytes: int = 100, inline_total_max_bytes: int = 250):
    """Version 0 of shard ``s`` with small inline limits."""
    return initial_state("s", b"schema", inline_max_bytes, inline_total_max_bytes, "s/rollup/0-x")


#: The id writer ``w`` gets registering on :func:`s0`: its name, then the
#: seqno of the version that registered it.
W1 = "w.1"


def blob_batch(
    bid: str, lower: int, upper: int, key: str | None = None, *, writer: str = W1
) -> Batch:
    """A batch of one (fake) blob part of shard ``s``, under ``writer``'s
    prefix unless ``key`` says otherwise."""
    key = key or f"{part_prefix('s', writer)}{bid}"
    part = BlobPart(key=key, encoded_bytes=10, rows=1, ts_lo=lower, ts_hi=lower)
    return Batch(id=bid, lower=lower, upper=upper, parts=(part,), rows=1)


def inline_batch(bid: str, lower: int, upper: int, size: int = 40) -> Batch:
    part = InlinePart(data=b"x" * size, rows=1, ts_lo=lower, ts_hi=lower)
    return Batch(id=bid, lower=lower, upper=upper, parts=(part,), rows=1)


def spine_pass(
    shard,
    *,
    target_bytes: int,
    stats: ShardStats | None = None,
    writer_id: str | None = None,
) -> CompactionReport:
    """One round of the spine's merges on the latest state of ``shard``, as
    the registered writer ``writer_id`` (default: one registered for the
    round and expired after it), what a consensus server's merge lanes do."""
    writer = writer_id or register_writer(shard.machine, f"spine-{uuid.uuid4().hex}")
    try:
        state = shard.machine.state(refresh=True)
        return merge_runs(
            shard.machine,
            shard.blob,
            state,
            spine.merges(state),
            target_bytes,
            stats or ShardStats(),
            writer,
        )
    finally:
        if writer_id is None:
            shard.machine.run(ExpireWriter(writer))


def apply(state: ShardState, command: Command, now_ms: int) -> tuple[ShardState | None, Result]:
    """:func:`~shardsink.persist.transitions.step`'s next version alone:
    ``(new_state or None, result)``."""
    made, result = step(state, command, now_ms)
    return (None if made is None else made.new), result
