"""Every change to a shard's state, and every answer, as msgspec Structs.

``Command`` and ``Result`` are tagged unions, so a command can cross a socket
as MessagePack and be decoded strictly on the other side. Each command is
applied by :func:`shardsink.persist.transitions.apply`; re-applying a command
that already took effect (after an indeterminate commit) is harmless and
answers as if it were the first time it succeeded.
"""

from __future__ import annotations

import msgspec

from .state import Batch, ShardState

_OPTS = {"frozen": True, "forbid_unknown_fields": True}


# --- commands -----------------------------------------------------------------


class RegisterWriter(msgspec.Struct, tag="register_writer", **_OPTS):
    """Record ``writer_id`` (no-op if known). Answer: :class:`Done`."""

    writer_id: str


class ExpireWriter(msgspec.Struct, tag="expire_writer", **_OPTS):
    """Forget ``writer_id`` (no-op if unknown). Answer: :class:`Done`."""

    writer_id: str


class HeartbeatWriter(msgspec.Struct, tag="heartbeat_writer", **_OPTS):
    """Record that ``writer_id`` is alive now, registering it if it is not in
    state (expired while paused past its lease, it comes back on its next
    heartbeat). Answer: :class:`Done`."""

    writer_id: str


class ExpireWriters(msgspec.Struct, tag="expire_writers", **_OPTS):
    """Drop every writer last seen (registered, appended or heartbeated) more
    than ``lease_ms`` ago. An expired writer loses its idempotency token: a
    retry of its last append is then answered :class:`WrongUpper`, not
    :class:`AlreadyAppended`, so the lease must outlast any retry. Answers:
    :class:`Done`, :class:`Rejected` for a lease below 1 ms."""

    lease_ms: int


class CompareAndAppend(msgspec.Struct, tag="compare_and_append", **_OPTS):
    """Append ``batches`` (each ``[expected_upper, new_upper)``) and advance the
    upper to ``new_upper`` iff the upper is ``expected_upper``.

    Answers: :class:`Appended`; :class:`AlreadyAppended` if this writer's last
    append carried ``token``; :class:`WrongUpper`; :class:`InlineCapExceeded`;
    :class:`Rejected` for a malformed command. Batches without parts are not
    stored (an empty interval only advances the upper).
    """

    writer_id: str
    token: str
    batches: tuple[Batch, ...]
    expected_upper: int
    new_upper: int


class RegisterReader(msgspec.Struct, tag="register_reader", **_OPTS):
    """Register ``reader_id`` holding the new version's seqno (or renew it).
    Answer: :class:`Leased`."""

    reader_id: str
    lease_ms: int


class LeaseSeqno(msgspec.Struct, tag="lease_seqno", **_OPTS):
    """Heartbeat ``reader_id`` and move its hold to the new version's seqno,
    answering :class:`Leased` with that version: the reader selects what to read
    from exactly the state its lease protects. :class:`ReaderExpired` if the
    reader is not registered."""

    reader_id: str


class HeartbeatReader(msgspec.Struct, tag="heartbeat_reader", **_OPTS):
    """Renew ``reader_id``'s lease without moving its hold. Answers:
    :class:`Done`, :class:`ReaderExpired`."""

    reader_id: str


class ExpireReader(msgspec.Struct, tag="expire_reader", **_OPTS):
    """Drop ``reader_id`` and its hold (no-op if unknown). Answer: :class:`Done`."""

    reader_id: str


class ExpireReaders(msgspec.Struct, tag="expire_readers", **_OPTS):
    """Drop every reader whose lease has run out. Answer: :class:`Done`."""


class AdvanceSince(msgspec.Struct, tag="advance_since", **_OPTS):
    """Raise ``since`` to ``since`` (no-op if already there); it must stay below
    the upper. Answers: :class:`Done`, :class:`Rejected`."""

    since: int


class Retain(msgspec.Struct, tag="retain", **_OPTS):
    """Advance ``since`` by the retention policy: to
    :func:`~shardsink.persist.transitions.retention_since` of ``retain``
    (a duration in the shard's time unit), computed against the state it
    applies to, so a reader leasing meanwhile is never passed. Answers:
    :class:`Done` (also when since stays), :class:`Rejected` for ``retain < 1``."""

    retain: int


class ApplyCompaction(msgspec.Struct, tag="apply_compaction", **_OPTS):
    """Replace the batches ``inputs`` by ``output``, iff all inputs are still in
    state and adjacent in time order, and ``output`` spans exactly them.
    The inputs' blob keys are retired. Answers: :class:`Done` (also when
    ``output`` is already in state), :class:`Rejected`,
    :class:`InlineCapExceeded`."""

    inputs: tuple[str, ...]
    output: Batch


class AddRollup(msgspec.Struct, tag="add_rollup", **_OPTS):
    """Record that the full state of version ``seqno`` is in blob under ``key``
    (no-op if a rollup at or after ``seqno`` is recorded). Answers:
    :class:`Done`, :class:`Rejected`."""

    seqno: int
    key: str


class ForgetRetired(msgspec.Struct, tag="forget_retired", **_OPTS):
    """Drop the retired entries of ``seqnos`` (their blobs were deleted).
    Answer: :class:`Done`."""

    seqnos: tuple[int, ...]


class ForgetRollups(msgspec.Struct, tag="forget_rollups", **_OPTS):
    """Retire the rollups older than ``below_seqno`` (consensus was truncated
    below it); the rollup at ``below_seqno`` must exist. Answers: :class:`Done`,
    :class:`Rejected`."""

    below_seqno: int


Command = (
    RegisterWriter
    | ExpireWriter
    | HeartbeatWriter
    | ExpireWriters
    | CompareAndAppend
    | RegisterReader
    | LeaseSeqno
    | HeartbeatReader
    | ExpireReader
    | ExpireReaders
    | AdvanceSince
    | Retain
    | ApplyCompaction
    | AddRollup
    | ForgetRetired
    | ForgetRollups
)


# --- results ------------------------------------------------------------------


class Done(msgspec.Struct, tag="done", **_OPTS):
    """The command holds at version ``seqno`` (applied now or before)."""

    seqno: int


class Appended(msgspec.Struct, tag="appended", **_OPTS):
    """The batches were appended at version ``seqno``; the upper is ``upper``."""

    seqno: int
    upper: int


class AlreadyAppended(msgspec.Struct, tag="already_appended", **_OPTS):
    """The same token was appended before (a retry); it produced ``upper``."""

    upper: int


class WrongUpper(msgspec.Struct, tag="wrong_upper", **_OPTS):
    """Nothing appended: the upper is ``actual``, not ``expected``."""

    expected: int
    actual: int


class InlineCapExceeded(msgspec.Struct, tag="inline_cap_exceeded", **_OPTS):
    """Nothing changed: adding ``adding`` inline bytes to ``inline_bytes`` would
    pass the shard's cap ``cap``."""

    inline_bytes: int
    adding: int
    cap: int


class Rejected(msgspec.Struct, tag="rejected", **_OPTS):
    """Nothing changed: the command is invalid against this state, for ``reason``."""

    reason: str


class Leased(msgspec.Struct, tag="leased", **_OPTS):
    """The reader holds ``state.seqno``; ``state`` is that version."""

    state: ShardState


class ReaderExpired(msgspec.Struct, tag="reader_expired", **_OPTS):
    """Nothing changed: ``reader_id`` is not registered (expired or closed)."""

    reader_id: str


Result = (
    Done
    | Appended
    | AlreadyAppended
    | WrongUpper
    | InlineCapExceeded
    | Rejected
    | Leased
    | ReaderExpired
)

COMMAND_DECODER = msgspec.msgpack.Decoder(Command)
RESULT_DECODER = msgspec.msgpack.Decoder(Result)
