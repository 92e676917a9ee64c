"""Every change to a shard's state, and every answer, as msgspec Structs.

``Command`` and ``Result`` are tagged unions, so a command can cross a socket
as MessagePack and be decoded strictly on the other side. Each command is
applied by :func:`shardsink.persist.transitions.step`; re-applying a command
that already took effect (after an indeterminate commit) is harmless and
answers as if it were the first time it succeeded.
"""

from __future__ import annotations

import msgspec

from .state import Batch, ShardState

_OPTS = {"frozen": True, "forbid_unknown_fields": True}


# --- commands -----------------------------------------------------------------


class RegisterWriter(msgspec.Struct, tag="register_writer", **_OPTS):
    """Register a writer called ``name`` (one blob-key segment, unique to its
    client, e.g. with a uuid) under a fresh id, ``<name>.<seqno>`` of the
    version that registers it: ids are never reused, so a writer that
    expired never comes back under its old id, and its parts
    (:func:`~.state.part_prefix`) can be swept for good. A registered writer
    of that name is answered again (a retry after an indeterminate commit).
    Answers: :class:`Registered`, :class:`Rejected` for a bad name."""

    name: str


class ExpireWriter(msgspec.Struct, tag="expire_writer", **_OPTS):
    """Forget ``writer_id`` (no-op if unknown). Answer: :class:`Done`."""

    writer_id: str


class HeartbeatWriter(msgspec.Struct, tag="heartbeat_writer", **_OPTS):
    """Record that ``writer_id`` is alive now. A writer no longer in state
    (expired: paused or cut off past its lease) stays gone: its parts may
    have been swept, so it must register anew. Answers: :class:`Done`,
    :class:`WriterGone`."""

    writer_id: str


class ExpireWriters(msgspec.Struct, tag="expire_writers", **_OPTS):
    """Drop every writer last seen (registered, appended or heartbeated) more
    than ``lease_ms`` ago. An expired writer is gone for good: its appends
    and heartbeats are answered :class:`WriterGone`, and the leaked-blob
    sweep may take its unreferenced parts. It also loses its idempotency
    token, so the lease must outlast any retry of an append. Answers:
    :class:`Done`, :class:`Rejected` for a lease below 1 ms."""

    lease_ms: int


class CompareAndAppend(msgspec.Struct, tag="compare_and_append", **_OPTS):
    """Append ``batches`` (each ``[expected_upper, new_upper)``) and advance the
    upper to ``new_upper`` iff the upper is ``expected_upper``, for the
    registered writer ``writer_id``, whose blob parts all lie under its
    prefix (:func:`~.state.part_prefix`).

    Answers: :class:`Appended`; :class:`AlreadyAppended` if this writer's last
    append carried ``token``; :class:`WriterGone` if the writer is not
    registered (never registered, or expired); :class:`WrongUpper`;
    :class:`InlineCapExceeded`; :class:`Rejected` for a malformed command (a
    part outside the writer's prefix among them); from a machine,
    :class:`PartsMissing` if a blob part is not in blob as described.
    Batches without parts are not stored (an empty interval only advances
    the upper).
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
    """Replace the batches ``inputs`` by ``output``, written by the
    registered writer ``writer_id`` (its blob parts under that writer's
    prefix), iff all inputs are still in state and adjacent in time order,
    and ``output`` spans exactly them. The inputs' blob keys are retired.
    Answers: :class:`Done` (also when ``output`` is already in state),
    :class:`Rejected`, :class:`WriterGone`, :class:`InlineCapExceeded`; from
    a machine, :class:`PartsMissing`."""

    inputs: tuple[str, ...]
    output: Batch
    writer_id: str


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

#: The commands a client of a consensus server may send: its own writers'
#: and readers' business, and moving ``since`` (a user's act). The others
#: (expiry, retention, compaction, rollups, forgetting retired keys) are
#: maintenance, which the owner of a shard's state runs itself; a server
#: refuses them from clients, so no client can retire or delete what is not
#: its own.
CLIENT_COMMANDS: tuple[type, ...] = (
    RegisterWriter,
    ExpireWriter,
    HeartbeatWriter,
    CompareAndAppend,
    RegisterReader,
    LeaseSeqno,
    HeartbeatReader,
    ExpireReader,
    AdvanceSince,
)


# --- results ------------------------------------------------------------------


class Done(msgspec.Struct, tag="done", **_OPTS):
    """The command holds at version ``seqno`` (applied now or before)."""

    seqno: int


class Registered(msgspec.Struct, tag="registered", **_OPTS):
    """The writer is registered as ``writer_id`` (at version ``seqno`` or before)."""

    writer_id: str
    seqno: int


class WriterGone(msgspec.Struct, tag="writer_gone", **_OPTS):
    """Nothing changed: ``writer_id`` is not registered (it expired, or never
    was); it must register anew, and what it wrote under its old id is not
    its to commit any more."""

    writer_id: str


class PartsMissing(msgspec.Struct, tag="parts_missing", **_OPTS):
    """Nothing changed: the blob parts ``keys`` the command would commit are
    not in blob as described (missing, or of another length: ``reason``)."""

    keys: tuple[str, ...]
    reason: str


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
    | Registered
    | WriterGone
    | PartsMissing
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
