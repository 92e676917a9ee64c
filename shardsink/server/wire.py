"""Every message between a consensus server and its clients, as msgspec Structs.

``ServerRequest`` and ``ServerReply`` are tagged unions encoded as MessagePack and decoded
strictly (unknown fields and tags are errors); nothing is unpickled. Shard
commands and results are the shard machine's own
(:mod:`shardsink.persist.commands`), carried unchanged.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .._wire import Message
from ..persist import (
    Command,
    CompactionReport,
    CompareAndAppend,
    Contended,
    CorruptState,
    GcReport,
    MachineStats,
    Result,
    ShardConfig,
    ShardNotFound,
    ShardState,
    StateMissing,
)
from ..storage import DeterminateError, IndeterminateError

# --- requests -----------------------------------------------------------------


class Ping(Message, tag="ping"):
    """Answer: :class:`Pong`."""


class OpenShard(Message, tag="open_shard"):
    """Load (or, with ``create``, create with ``schema``) ``shard``.
    Answer: :class:`OpenedReply`."""

    shard: str
    schema: bytes
    config: ShardConfig
    create: bool = True


class RunCommand(Message, tag="run"):
    """Apply ``command`` to ``shard`` durably. Answer: :class:`RunReply`."""

    shard: str
    command: Command


class TransactionItem(Message):
    """One shard's compare-and-append of a :class:`RunTransaction`."""

    shard: str
    command: CompareAndAppend


class RunTransaction(Message, tag="transaction"):
    """Apply every item or none (:mod:`shardsink.persist.transactions`), the
    shards loaded on this server. Answer: :class:`TransactionReply`."""

    items: tuple[TransactionItem, ...]


class FetchState(Message, tag="fetch_state"):
    """The shard's latest state. Answer: :class:`StateReply`."""

    shard: str


class WaitForUpper(Message, tag="wait_for_upper"):
    """A long poll: answered with :class:`StateReply` as soon as the shard's
    upper is past ``past``, or after ``timeout_ms`` with the state as it is."""

    shard: str
    past: int
    timeout_ms: int


class Maintain(Message, tag="maintain"):
    """Run one maintenance ``job`` of ``shard`` in the server (its own
    writer's compaction, GC, or the leaked-blob sweep with ``grace_ms``,
    ``None``: the server's grace; never shorter than its writer lease), off
    the request loop. Answer: :class:`MaintainedReply` once it is done."""

    shard: str
    job: Literal["compact", "gc", "sweep"]
    grace_ms: int | None = None


class GetStats(Message, tag="get_stats"):
    """Per-shard counters of this server. Answer: :class:`StatsReply`."""


class ScanVersions(Message, tag="scan_versions"):
    """Stored versions of ``shard`` from ``from_seqno`` on, oldest first, at
    most ``limit`` (the server may send fewer). Answer: :class:`VersionsReply`."""

    shard: str
    from_seqno: int
    limit: int


ServerRequest = (
    Ping
    | OpenShard
    | RunCommand
    | RunTransaction
    | FetchState
    | WaitForUpper
    | Maintain
    | GetStats
    | ScanVersions
)


# --- replies ------------------------------------------------------------------


class Pong(Message, tag="pong"):
    """The server is up; ``pid`` identifies its process."""

    pid: int


class StateReply(Message, tag="state"):
    state: ShardState


class OpenedReply(Message, tag="opened"):
    """The opened shard's latest ``state``, and the writer lease this server
    expires writers by (a client heartbeats its writers by it)."""

    state: ShardState
    writer_lease_ms: int


class RunReply(Message, tag="ran"):
    """``result`` of the command and the state-storage work it caused."""

    result: Result
    work: MachineStats


class TransactionReply(Message, tag="transacted"):
    """Each item's result, in order (see :class:`~shardsink.persist.transactions.Transactions`)."""

    results: tuple[Result, ...]


class MaintainedReply(Message, tag="maintained"):
    """What a :class:`Maintain` job did: its compaction's or GC's report, or
    the blobs and temporary files the sweep removed."""

    compaction: CompactionReport | None = None
    gc: GcReport | None = None
    swept: tuple[str, ...] = ()


class Version(Message):
    """One stored version: its seqno and its state diff, encoded."""

    seqno: int
    data: bytes


class VersionsReply(Message, tag="versions"):
    versions: tuple[Version, ...]


class ShardCounters(Message):
    """What the server did for one shard since it started, and the size of
    its latest state (``batches``, ``parts``, ``inline_bytes``, ``readers``).
    Compaction's counts: ``compactions`` applied, replacing
    ``compacted_batches`` batches with one each, ``compactions_abandoned``
    (inputs gone or changed), and the data parts they wrote
    (``compaction_puts``, ``compaction_put_bytes``). ``failures``: runs of
    maintenance that raised, by kind (``expiry``, ``retention``, ``gc``,
    ``sweep``, ``compaction``; each is retried on schedule), and the last
    such error (``last_failure``, one line)."""

    shard: str
    seqno: int
    upper: int
    batches: int
    parts: int
    inline_bytes: int
    readers: int
    commands: int
    machine: MachineStats
    gc_runs: int
    blobs_deleted: int
    leaked_swept: int
    readers_expired: int
    writers_expired: int
    compactions: int
    compactions_abandoned: int
    compacted_batches: int
    compaction_puts: int
    compaction_put_bytes: int
    failures: dict[str, int] = {}
    last_failure: str = ""


class StatsReply(Message, tag="stats"):
    pid: int
    requests: int
    errors: int
    dropped: int
    shards: tuple[ShardCounters, ...]


class ErrorReply(Message, tag="error"):
    """The request failed. ``kind`` (one of :data:`ERROR_KINDS`, or
    ``internal``) says how the client should raise it; ``bad_request`` means
    malformed or invalid, nothing happened."""

    kind: str
    message: str


ServerReply = (
    Pong
    | StateReply
    | OpenedReply
    | RunReply
    | TransactionReply
    | MaintainedReply
    | VersionsReply
    | StatsReply
    | ErrorReply
)

#: The error kinds of an :class:`ErrorReply` and the exception each stands
#: for, most specific first: the server sends the first kind whose class the
#: error is an instance of (else ``internal``), the client raises that class
#: (``internal``, or an unknown kind: ``IndeterminateError``, since whether the
#: request took effect is unknown).
ERROR_KINDS: tuple[tuple[str, type[Exception]], ...] = (
    ("not_found", ShardNotFound),
    ("state_missing", StateMissing),
    ("bad_request", ValueError),
    ("indeterminate", IndeterminateError),
    ("determinate", DeterminateError),
    ("corrupt", CorruptState),
    ("contended", Contended),
)


def error_kind(exc: Exception) -> str:
    """The :data:`ERROR_KINDS` kind of ``exc``, or ``internal``."""
    return next((kind for kind, cls in ERROR_KINDS if isinstance(exc, cls)), "internal")


def error_class(kind: str) -> type[Exception]:
    """The exception a client raises for an :class:`ErrorReply` of ``kind``."""
    return dict(ERROR_KINDS).get(kind, IndeterminateError)


encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(ServerRequest).decode
decode_reply = msgspec.msgpack.Decoder(ServerReply).decode
