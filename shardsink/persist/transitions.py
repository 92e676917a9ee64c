"""Pure state transitions: ``step(state, command, now_ms)``.

No I/O and no clock reads here: the caller passes the time. ``step`` returns
``(next, result)`` where ``next`` is the next version (seqno + 1) with its
diff against ``state`` (a :class:`Step`), or ``None`` when the command
changes nothing (a no-op or a refusal). Each transition names what it
changes (:func:`~.diff.next_version`), so the diff costs what changed, not
the size of the state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import msgspec

from .commands import (
    AddRollup,
    AdvanceSince,
    AlreadyAppended,
    Appended,
    ApplyCompaction,
    Command,
    CompareAndAppend,
    Done,
    ExpireReader,
    ExpireReaders,
    ExpireWriter,
    ExpireWriters,
    ForgetRetired,
    ForgetRollups,
    HeartbeatReader,
    HeartbeatWriter,
    InlineCapExceeded,
    Leased,
    LeaseSeqno,
    ReaderExpired,
    Registered,
    RegisterReader,
    RegisterWriter,
    Rejected,
    Result,
    Retain,
    WriterGone,
    WrongUpper,
)
from .diff import StateDiff, next_version
from .digest import total_known
from .state import (
    Batch,
    BlobPart,
    InlinePart,
    ReaderState,
    RollupRef,
    ShardState,
    WriterState,
    part_prefix,
)


class Step(msgspec.Struct, frozen=True):
    """A command's next version and its diff against the version before."""

    new: ShardState
    diff: StateDiff


Outcome = tuple[Step | None, Result]

#: A writer's name is one blob-key segment (its id prefixes its parts' keys).
_NAME_RE = re.compile(r"^[A-Za-z0-9_.=-]{1,200}$")


def initial_state(
    shard: str, schema: bytes, inline_max_bytes: int, inline_total_max_bytes: int, rollup_key: str
) -> ShardState:
    """Version 0 of a new shard, whose rollup is stored under ``rollup_key``."""
    return ShardState(
        shard=shard,
        seqno=0,
        schema=schema,
        inline_max_bytes=inline_max_bytes,
        inline_total_max_bytes=inline_total_max_bytes,
        rollups={0: RollupRef(0, rollup_key)},
    )


def step(state: ShardState, command: Command, now_ms: int) -> Outcome:
    """Apply ``command`` to ``state`` at time ``now_ms``. ``TypeError`` for a
    value that is not a command."""
    handler = _HANDLERS.get(type(command))
    if handler is None:
        raise TypeError(f"not a shard command: {command!r}")
    return handler(state, command, now_ms)


def _next(state: ShardState, **changes: object) -> Step:
    return Step(*next_version(state, **changes))


def _unchanged(state: ShardState) -> Outcome:
    return None, Done(state.seqno)


def _retire(state: ShardState, keys: Iterable[str]) -> dict[int, tuple[str, ...]]:
    """The ``retired_put`` of a version that retires ``keys``."""
    keys = tuple(keys)
    return {state.seqno + 1: keys} if keys else {}


def _check_inline(state: ShardState, batches: Iterable[Batch], freed: int) -> Result | None:
    """Refuse inline parts above the per-part limit or past the shard-wide cap,
    given that ``freed`` inline bytes leave the state in the same change."""
    adding = 0
    for batch in batches:
        for part in batch.parts:
            if isinstance(part, InlinePart):
                if len(part.data) >= state.inline_max_bytes:
                    return Rejected(
                        f"inline part of {len(part.data)} bytes in batch {batch.id!r} is not "
                        f"below the shard's inline_max_bytes {state.inline_max_bytes}"
                    )
                adding += len(part.data)
    if adding and state.inline_bytes - freed + adding > state.inline_total_max_bytes:
        return InlineCapExceeded(state.inline_bytes - freed, adding, state.inline_total_max_bytes)
    return None


def _check_parts(state: ShardState, writer_id: str, batches: Iterable[Batch]) -> Result | None:
    """Refuse a blob part outside the writer's prefix (:func:`~.state.part_prefix`)."""
    prefix = part_prefix(state.shard, writer_id)
    for batch in batches:
        for part in batch.parts:
            if isinstance(part, BlobPart) and not part.key.startswith(prefix):
                return Rejected(
                    f"part {part.key!r} of batch {batch.id!r} is not under writer "
                    f"{writer_id!r}'s prefix {prefix!r}: a writer commits only what it wrote"
                )
    return None


def _register_writer(state: ShardState, cmd: RegisterWriter, now_ms: int) -> Outcome:
    if not _NAME_RE.match(cmd.name) or cmd.name in (".", ".."):
        return None, Rejected(
            f"writer name {cmd.name!r} must be one blob-key segment of [A-Za-z0-9_.=-]"
        )
    known = next((w for w in state.writers if w.rpartition(".")[0] == cmd.name), None)
    if known is not None:
        return None, Registered(known, state.seqno)
    writer_id = f"{cmd.name}.{state.seqno + 1}"
    writer = WriterState(token="", upper=state.upper, heartbeat_ms=now_ms)
    made = _next(state, writers_put={writer_id: writer})
    return made, Registered(writer_id, made.new.seqno)


def _expire_writer(state: ShardState, cmd: ExpireWriter, now_ms: int) -> Outcome:
    if cmd.writer_id not in state.writers:
        return _unchanged(state)
    made = _next(state, writers_del=(cmd.writer_id,))
    return made, Done(made.new.seqno)


def _heartbeat_writer(state: ShardState, cmd: HeartbeatWriter, now_ms: int) -> Outcome:
    known = state.writers.get(cmd.writer_id)
    if known is None:
        return None, WriterGone(cmd.writer_id)
    beat = msgspec.structs.replace(known, heartbeat_ms=now_ms)
    made = _next(state, writers_put={cmd.writer_id: beat})
    return made, Done(made.new.seqno)


def _expire_writers(state: ShardState, cmd: ExpireWriters, now_ms: int) -> Outcome:
    if cmd.lease_ms < 1:
        return None, Rejected(f"writer lease must be >= 1 ms, got {cmd.lease_ms}")
    gone = tuple(k for k, w in state.writers.items() if now_ms > w.heartbeat_ms + cmd.lease_ms)
    if not gone:
        return _unchanged(state)
    made = _next(state, writers_del=gone)
    return made, Done(made.new.seqno)


def _compare_and_append(state: ShardState, cmd: CompareAndAppend, now_ms: int) -> Outcome:
    if not cmd.token:
        return None, Rejected("compare_and_append needs a non-empty idempotency token")
    writer = state.writers.get(cmd.writer_id)
    if writer is None:
        return None, WriterGone(cmd.writer_id)
    if writer.token == cmd.token:
        return None, AlreadyAppended(writer.upper)
    if cmd.new_upper <= cmd.expected_upper:
        return None, Rejected(
            f"new upper {cmd.new_upper} must be greater than expected upper {cmd.expected_upper}"
        )
    ids: set[str] = set()
    for batch in cmd.batches:
        if (batch.lower, batch.upper) != (cmd.expected_upper, cmd.new_upper):
            return None, Rejected(
                f"batch {batch.id!r} covers [{batch.lower}, {batch.upper}), not the appended "
                f"interval [{cmd.expected_upper}, {cmd.new_upper})"
            )
        if batch.id in ids:
            return None, Rejected(f"batch id {batch.id!r} appears twice")
        ids.add(batch.id)
    if state.upper != cmd.expected_upper:
        return None, WrongUpper(cmd.expected_upper, state.upper)
    if ids & state.batches.keys():
        return None, Rejected(f"batch ids {sorted(ids & state.batches.keys())} are already in use")
    refusal = _check_parts(state, cmd.writer_id, cmd.batches) or _check_inline(
        state, cmd.batches, freed=0
    )
    if refusal is not None:
        return None, refusal
    stored = _one_batch([b for b in cmd.batches if b.parts])
    made = _next(
        state,
        upper=cmd.new_upper,
        inline_bytes=state.inline_bytes + (stored.inline_bytes if stored else 0),
        batches_put={stored.id: stored} if stored else {},
        writers_put={cmd.writer_id: WriterState(cmd.token, cmd.new_upper, now_ms)},
    )
    return made, Appended(made.new.seqno, made.new.upper)


def _one_batch(batches: list[Batch]) -> Batch | None:
    """The batches of one append as one stored batch: their parts under the
    first one's id. An append of G groups' shared batches (or W workers' own)
    is one batch in state, not G: the spine merges, and every later version's
    diff carries, one entry per interval instead of one per writer."""
    if len(batches) <= 1:
        return batches[0] if batches else None
    first = batches[0]
    return msgspec.structs.replace(
        first,
        parts=tuple(part for batch in batches for part in batch.parts),
        rows=sum(batch.rows for batch in batches),
        digest=total_known(batch.digest for batch in batches),
    )


def _register_reader(state: ShardState, cmd: RegisterReader, now_ms: int) -> Outcome:
    if cmd.lease_ms < 1:
        return None, Rejected(f"reader lease must be >= 1 ms, got {cmd.lease_ms}")
    reader = ReaderState(state.seqno + 1, now_ms, cmd.lease_ms, upper_hold=state.upper)
    made = _next(state, readers_put={cmd.reader_id: reader})
    return made, Leased(made.new)


def _lease_seqno(state: ShardState, cmd: LeaseSeqno, now_ms: int) -> Outcome:
    reader = state.readers.get(cmd.reader_id)
    if reader is None:
        return None, ReaderExpired(cmd.reader_id)
    held = ReaderState(state.seqno + 1, now_ms, reader.lease_ms, upper_hold=state.upper)
    made = _next(state, readers_put={cmd.reader_id: held})
    return made, Leased(made.new)


def _heartbeat_reader(state: ShardState, cmd: HeartbeatReader, now_ms: int) -> Outcome:
    reader = state.readers.get(cmd.reader_id)
    if reader is None:
        return None, ReaderExpired(cmd.reader_id)
    beat = msgspec.structs.replace(reader, heartbeat_ms=now_ms)
    made = _next(state, readers_put={cmd.reader_id: beat})
    return made, Done(made.new.seqno)


def _drop_readers(state: ShardState, drop: Callable[[str, ReaderState], bool]) -> Outcome:
    gone = tuple(k for k, v in state.readers.items() if drop(k, v))
    if not gone:
        return _unchanged(state)
    made = _next(state, readers_del=gone)
    return made, Done(made.new.seqno)


def _expire_reader(state: ShardState, cmd: ExpireReader, now_ms: int) -> Outcome:
    return _drop_readers(state, lambda rid, _: rid == cmd.reader_id)


def _expire_readers(state: ShardState, cmd: ExpireReaders, now_ms: int) -> Outcome:
    return _drop_readers(state, lambda _, r: r.expired(now_ms))


def _advance_since(state: ShardState, cmd: AdvanceSince, now_ms: int) -> Outcome:
    if cmd.since <= state.since:
        return _unchanged(state)
    if cmd.since >= state.upper:
        # some time must stay readable: since <= as_of < upper
        return None, Rejected(f"since {cmd.since} must stay below the upper {state.upper}")
    made = _next(state, since=cmd.since)
    return made, Done(made.new.seqno)


def retention_since(state: ShardState, retain: int, now_ms: int) -> int:
    """The since the retention policy allows: times at least ``retain``
    below the upper may be merged forward, and each live (not expired) reader
    holds back the times its version kept readable, ``upper_hold - retain``.
    Never below the current since, always below the upper (some time stays
    readable)."""
    holds = [r.upper_hold for r in state.readers.values() if not r.expired(now_ms)]
    target = min([state.upper, *holds]) - retain
    return max(state.since, min(target, state.upper - 1))


def _retain(state: ShardState, cmd: Retain, now_ms: int) -> Outcome:
    if cmd.retain < 1:
        return None, Rejected(f"retain must be >= 1, got {cmd.retain}")
    since = retention_since(state, cmd.retain, now_ms)
    if since <= state.since:
        return _unchanged(state)
    made = _next(state, since=since)
    return made, Done(made.new.seqno)


def _apply_compaction(state: ShardState, cmd: ApplyCompaction, now_ms: int) -> Outcome:
    out = cmd.output
    if out.id in state.batches:
        return _unchanged(state)
    if cmd.writer_id not in state.writers:
        return None, WriterGone(cmd.writer_id)
    refusal = _check_parts(state, cmd.writer_id, [out])
    if refusal is not None:
        return None, refusal
    if not cmd.inputs or len(set(cmd.inputs)) != len(cmd.inputs):
        return None, Rejected("compaction needs one or more distinct input batches")
    missing = [i for i in cmd.inputs if i not in state.batches]
    if missing:
        return None, Rejected(f"compaction inputs no longer in state: {missing}")
    order = [b.id for b in state.ordered_batches()]
    positions = sorted(order.index(i) for i in cmd.inputs)
    if positions[-1] - positions[0] != len(positions) - 1:
        return None, Rejected("compaction inputs are not adjacent in time order")
    inputs = [state.batches[i] for i in cmd.inputs]
    lower, upper = min(b.lower for b in inputs), max(b.upper for b in inputs)
    if (out.lower, out.upper) != (lower, upper):
        return None, Rejected(
            f"compaction output covers [{out.lower}, {out.upper}), its inputs [{lower}, {upper})"
        )
    refusal = _check_digest(inputs, out)
    if refusal is not None:
        return None, refusal
    freed = sum(b.inline_bytes for b in inputs)
    refusal = _check_inline(state, [out], freed=freed)
    if refusal is not None:
        return None, refusal
    made = _next(
        state,
        batches_del=cmd.inputs,
        batches_put={out.id: out},
        inline_bytes=state.inline_bytes - freed + out.inline_bytes,
        retired_put=_retire(state, (k for b in inputs for k in b.blob_keys())),
    )
    return made, Done(made.new.seqno)


def _check_digest(inputs: list[Batch], out: Batch) -> Rejected | None:
    """A compaction's output must carry what its inputs were written with:
    the sum of their digests (``None`` exactly when one of them has none or
    they are of two schemes), the same content in the same scheme. So no
    compaction drops a digest, and verify checks the merged rows against
    what the writers wrote."""
    written = total_known(b.digest for b in inputs)
    if written is None and out.digest is None:
        return None
    if (
        written is None
        or out.digest is None
        or not out.digest.same_content(written)
        or (out.digest.scheme != written.scheme and not written.empty())
    ):
        return Rejected(
            f"compaction output {out.id} carries digest {out.digest}; its inputs were "
            f"written with {written}"
        )
    return None


def _add_rollup(state: ShardState, cmd: AddRollup, now_ms: int) -> Outcome:
    if cmd.seqno > state.seqno:
        return None, Rejected(f"rollup of version {cmd.seqno} is ahead of version {state.seqno}")
    if cmd.seqno <= state.latest_rollup().seqno:
        return _unchanged(state)
    made = _next(state, rollups_put={cmd.seqno: RollupRef(cmd.seqno, cmd.key)})
    return made, Done(made.new.seqno)


def _forget_retired(state: ShardState, cmd: ForgetRetired, now_ms: int) -> Outcome:
    drop = set(cmd.seqnos) & state.retired.keys()
    if not drop:
        return _unchanged(state)
    made = _next(state, retired_del=tuple(sorted(drop)))
    return made, Done(made.new.seqno)


def _forget_rollups(state: ShardState, cmd: ForgetRollups, now_ms: int) -> Outcome:
    if cmd.below_seqno not in state.rollups:
        return None, Rejected(f"no rollup at seqno {cmd.below_seqno} to keep")
    old = [s for s in state.rollups if s < cmd.below_seqno]
    if not old:
        return _unchanged(state)
    made = _next(
        state,
        rollups_del=tuple(old),
        retired_put=_retire(state, (state.rollups[s].key for s in sorted(old))),
    )
    return made, Done(made.new.seqno)


_HANDLERS: dict[type, Callable[[ShardState, object, int], Outcome]] = {
    RegisterWriter: _register_writer,
    ExpireWriter: _expire_writer,
    HeartbeatWriter: _heartbeat_writer,
    ExpireWriters: _expire_writers,
    CompareAndAppend: _compare_and_append,
    RegisterReader: _register_reader,
    LeaseSeqno: _lease_seqno,
    HeartbeatReader: _heartbeat_reader,
    ExpireReader: _expire_reader,
    ExpireReaders: _expire_readers,
    AdvanceSince: _advance_since,
    Retain: _retain,
    ApplyCompaction: _apply_compaction,
    AddRollup: _add_rollup,
    ForgetRetired: _forget_retired,
    ForgetRollups: _forget_rollups,
}
