"""Compaction: merge runs of adjacent small batches into parts near the
target size, off the append path.

The merged batch replaces its inputs only through the ``ApplyCompaction``
command, which checks that the inputs are still in state and adjacent. The
merge forwards times below ``since`` to ``since`` and consolidates, so every
snapshot at a readable time (``as_of >= since``) is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import msgspec
import pyarrow as pa

from .. import faults
from ..storage import Blob
from . import parts as P, windows
from .batches import SortedBatchBuilder, discard, flush_inline
from .commands import ApplyCompaction, Command, Done, InlineCapExceeded, Result
from .digest import Digest, comparable, digest, total_known
from .errors import CorruptState
from .machine import ShardMachine
from .state import Batch, InlinePart, Part, ShardState
from .stats import ShardStats

#: Rows a merge consolidates at a time (see :func:`~.windows.key_windows`). A
#: consensus server runs merges beside its requests for days, so they keep
#: small: merging 4M rows into 8 MiB parts peaked 104 MiB above the process's
#: size with the reader's 128Ki-row windows, 52 MiB with these.
WINDOW_ROWS = 32 * 1024


class CompactionReport(msgspec.Struct, kw_only=True):
    """What one :func:`compact` call did: ``applied`` runs replaced
    ``batches_merged`` batches; ``skipped`` runs lost their inputs to a
    concurrent change (their output blobs are deleted)."""

    applied: int = 0
    batches_merged: int = 0
    skipped: int = 0


def plan(state: ShardState, target_bytes: int) -> list[list[Batch]]:
    """Runs of two or more adjacent batches, each below half of
    ``target_bytes``, together at most ``target_bytes``."""
    runs: list[list[Batch]] = []
    run: list[Batch] = []
    size = 0
    for batch in state.ordered_batches():
        small = batch.encoded_bytes < target_bytes // 2
        if small and size + batch.encoded_bytes <= target_bytes:
            run.append(batch)
            size += batch.encoded_bytes
            continue
        if len(run) >= 2:
            runs.append(run)
        run, size = ([batch], batch.encoded_bytes) if small else ([], 0)
    if len(run) >= 2:
        runs.append(run)
    return runs


def compact(
    machine: ShardMachine,
    blob: Blob,
    schema: pa.Schema,
    *,
    target_bytes: int,
    stats: ShardStats,
    writer_id: str,
) -> CompactionReport:
    """Compact every run :func:`plan` finds in the latest state, writing the
    merged parts as the registered writer ``writer_id``."""
    state = machine.state(refresh=True)
    runs = plan(state, target_bytes)
    return _apply(machine, blob, schema, state, runs, target_bytes, stats, writer_id, machine.run)


def merge_runs(
    machine: ShardMachine,
    blob: Blob,
    state: ShardState,
    runs: list[list[Batch]],
    target_bytes: int,
    stats: ShardStats,
    writer_id: str,
    *,
    run: Callable[[Command], Result] | None = None,
) -> CompactionReport:
    """Merge each run of batches of ``state`` into one batch, one compaction
    each, written as the registered writer ``writer_id``; the shard's schema
    comes from ``state``. ``run`` applies each ``ApplyCompaction`` (default
    ``machine.run``; a consensus server's group commit)."""
    schema = P.schema_from_bytes(state.schema)
    return _apply(
        machine, blob, schema, state, runs, target_bytes, stats, writer_id, run or machine.run
    )


def _apply(
    machine: ShardMachine,
    blob: Blob,
    schema: pa.Schema,
    state: ShardState,
    runs: list[list[Batch]],
    target_bytes: int,
    stats: ShardStats,
    writer_id: str,
    run_command: Callable[[Command], Result],
) -> CompactionReport:
    """Merge each run of ``state`` and replace it through ``ApplyCompaction``
    (applied by ``run_command``)."""
    report = CompactionReport()
    for run in runs:
        output = _merge(machine.shard, blob, schema, state, run, target_bytes, stats, writer_id)
        result = None
        if output is not None:
            faults.point("compaction.after_write")
            command = ApplyCompaction(tuple(b.id for b in run), output, writer_id)
            result = run_command(command)
            if isinstance(result, InlineCapExceeded):
                output = flush_inline(blob, machine.shard, writer_id, output, schema, stats)
                result = run_command(msgspec.structs.replace(command, output=output))
        if output is None or not isinstance(result, Done):
            if output is not None:
                # refused, so never committed; its writer lives on (a server's
                # runs for days), so the sweep would not take these
                discard(blob, [output])
            report.skipped += 1
        else:
            report.applied += 1
            report.batches_merged += len(run)
            faults.point("compaction.after_commit")
    stats.compactions += report.applied
    return report


def _merge(
    shard: str,
    blob: Blob,
    schema: pa.Schema,
    state: ShardState,
    run: list[Batch],
    target_bytes: int,
    stats: ShardStats,
    writer_id: str,
) -> Batch | None:
    """The merged batch of ``run``, or ``None`` if an input part is gone
    (what it wrote is deleted). Streams by key range (:func:`~.windows.key_windows`)
    into parts cut at ``target_bytes`` of Parquet (:class:`~.batches.SortedBatchBuilder`),
    so memory holds a window and one output part's encoding, not the run."""
    builder = SortedBatchBuilder(
        blob,
        shard,
        writer_id,
        run[0].lower,
        max(b.upper for b in run),
        inline_max_bytes=state.inline_max_bytes,
        target_bytes=target_bytes,
        stats=stats,
        since=state.since,
        digests=False,
    )
    parts = [part for batch in run for part in batch.parts]
    written = total_known(b.digest for b in run)
    held = Digest()
    # every input row: its ts is below its batch's upper, or was forwarded to
    # an earlier since
    every = max(builder.upper - 1, state.since)
    try:
        if _all_inline(parts):
            tables = iter([pa.concat_tables([_decoded(shard, schema, p) for p in parts])])
        else:
            tables = (
                table
                for table, _ in windows.key_windows(
                    parts, partial(_chunks, blob, shard, schema), every, schema,
                    window_rows=WINDOW_ROWS,
                )
            )  # fmt: skip
        for table in tables:
            # one record batch a window: the builder streams each batch it is
            # given into the output part, and a run of 4-row inline parts
            # made a row group (and a Parquet write) of each
            merged = P.consolidate(P.forward(table, state.since)).combine_chunks()
            held = held + digest(merged)
            for batch in merged.to_batches():
                builder.add(batch)
            del table, merged
    except windows.Missing:
        builder.abort()
        return None
    except BaseException:
        builder.abort()
        raise
    if written is not None and comparable(written, schema) and not held.same_content(written):
        # a compaction retires its inputs: what it wrote must hold what they held
        builder.abort()
        raise CorruptState(
            f"shard {shard!r}: the merge of batches {', '.join(b.id for b in run)} "
            f"[{run[0].lower}, {builder.upper}) holds {held.describe()}, its inputs were "
            f"written with {written.describe()}: not committed"
        )
    # what the run was written with, not what it holds now: a part damaged
    # since is found by verify, not given a digest that agrees with it
    return msgspec.structs.replace(builder.finish(), digest=written)


def _all_inline(parts: list[Part]) -> bool:
    """Whether ``parts`` are all inline and hold one window's rows at most:
    then they are merged decoded whole, in one consolidation, without the
    key windows' cursors. Why: a 64-shard server's merges of 4-row inline
    appends spent 60% of its CPU, about a third of it in the cursors and
    order checks of parts a few rows long (py-spy, ``bench appends --shards 64``)."""
    # no parts at all: nothing to decode (state keeps no empty batch, but a
    # run of them would take the windows' way, which reads nothing)
    inline = bool(parts) and all(isinstance(p, InlinePart) for p in parts)
    return inline and sum(p.rows for p in parts) <= WINDOW_ROWS


def _decoded(shard: str, schema: pa.Schema, part: InlinePart) -> pa.Table:
    try:
        return P.decode_inline(part, schema)
    except ValueError as exc:
        raise P.corrupt(shard, part, exc) from None


def _chunks(blob: Blob, shard: str, schema: pa.Schema, part: Part):
    return windows.part_chunks(blob, shard, part, schema, windows.CHUNK_ROWS)
