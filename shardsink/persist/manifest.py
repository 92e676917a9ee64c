"""What a snapshot reads, for any engine, and what each version did.

:func:`manifest` lists the blob parts and inline updates a snapshot as of a
time reads, with the rule that computes the snapshot from them;
:func:`history` and :func:`history_entry` describe the retained versions that
changed a shard's data.
"""

from __future__ import annotations

from collections import deque

import pyarrow as pa
import pyarrow.compute as pc

from . import parts as P
from .diff import StateDiff, decode_version
from .machine import ShardMachine
from .state import BlobPart, ShardState
from .windows import readable

#: How a snapshot is computed from a manifest's updates (parts and inline).
RULE = (
    "updates = the rows of every part, and the inline rows; keep ts <= as_of; per (key, val) "
    "sum diff; drop zero sums; ts = as_of; order by key, val"
)


def manifest(state: ShardState, as_of: int | None, schema: pa.Schema) -> dict:
    """What a snapshot of ``state`` as of ``as_of`` reads, for any engine:
    the blob parts holding updates at or before it (key, rows, bytes, key and
    ts bounds, batch), the inline updates at or before it as rows, the
    schema and :data:`RULE`. ``as_of`` ``None`` (a shard never written) reads
    nothing. The parts stay in blob while a version that lists them is leased
    or current; after a compaction, GC may delete them."""
    parts: list[dict] = []
    inline: list[dict] = []
    batches = [] if as_of is None else [b for b in state.ordered_batches() if b.lower <= as_of]
    for batch in batches:
        for part in readable(batch.parts, as_of):
            if isinstance(part, BlobPart):
                parts.append(
                    {
                        "key": part.key,
                        "batch": batch.id,
                        "rows": part.rows,
                        "bytes": part.encoded_bytes,
                        "ts_lo": part.ts_lo,
                        "ts_hi": part.ts_hi,
                        "key_lo": part.key_lo,
                        "key_hi": part.key_hi,
                    }
                )
            else:
                try:
                    table = P.decode_inline(part, schema)
                except ValueError as exc:
                    raise P.corrupt(state.shard, part, exc) from None
                at = table.filter(pc.less_equal(table["ts"], pa.scalar(as_of, pa.uint64())))
                inline.extend(at.to_pylist())
    return {
        "shard": state.shard,
        "seqno": state.seqno,
        "as_of": as_of,
        "upper": state.upper,
        "since": state.since,
        "schema": [{"name": f.name, "type": str(f.type)} for f in schema],
        "rule": RULE,
        "parts": parts,
        "inline": inline,
    }


def history(machine: ShardMachine, limit: int, page: int = 1000) -> list[dict]:
    """The last ``limit`` retained versions of the machine's shard that
    changed its data (upper, since or batches), oldest first, each as
    :func:`history_entry`. Versions below the oldest rollup still needed are
    truncated and not shown. :class:`CorruptState` if a version is not a
    state diff."""
    shard = machine.shard
    kept: deque[dict] = deque(maxlen=limit)
    seqno = 0
    while versions := machine.versions(seqno, page):
        for version in versions:
            d = decode_version(shard, version)
            if d.upper is not None or d.since is not None or d.batches_put or d.batches_del:
                kept.append(history_entry(d))
        seqno = versions[-1].seqno + 1
    return list(kept)


def history_entry(d: StateDiff) -> dict:
    """What version ``d.seqno`` changed: its new upper and since (``None`` if
    unchanged), the batches it added (interval, rows, parts, bytes) and the
    ids it replaced, and the writer that appended it with that writer's
    wall-clock time in ms (``None`` for maintenance such as compaction)."""
    writer = next(iter(d.writers_put.items()), None)
    return {
        "seqno": d.seqno,
        "upper": d.upper,
        "since": d.since,
        "added": [
            {
                "batch": batch.id,
                "lower": batch.lower,
                "upper": batch.upper,
                "rows": batch.rows,
                "parts": len(batch.parts),
                "bytes": batch.encoded_bytes,
            }
            for batch in d.batches_put.values()
        ],
        "replaced": list(d.batches_del),
        "writer": writer[0] if writer else None,
        "wall_ms": writer[1].heartbeat_ms if writer else None,
    }
