"""Every message between a consensus server and its clients, as msgspec Structs.

``Request`` and ``Reply`` are tagged unions encoded as MessagePack and decoded
strictly (unknown fields and tags are errors); nothing is unpickled. Shard
commands and results are the shard machine's own
(:mod:`shardsink.persist.commands`), carried unchanged.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..persist.commands import Command, Result
from ..persist.compaction import CompactionReport
from ..persist.config import ShardConfig
from ..persist.errors import Contended, CorruptState, ShardNotFound, StateMissing
from ..persist.gc import GcReport
from ..persist.state import ShardState
from ..persist.stats import MachineStats
from ..storage.errors import DeterminateError, IndeterminateError

_OPTS = {"frozen": True, "forbid_unknown_fields": True}


# --- requests -----------------------------------------------------------------


class Ping(msgspec.Struct, tag="ping", **_OPTS):
    """Answer: :class:`Pong`."""


class OpenShard(msgspec.Struct, tag="open_shard", **_OPTS):
    """Load (or, with ``create``, create with ``schema``) ``shard``.
    Answer: :class:`OpenedReply`."""

    shard: str
    schema: bytes
    config: ShardConfig
    create: bool = True


class RunCommand(msgspec.Struct, tag="run", **_OPTS):
    """Apply ``command`` to ``shard`` durably. Answer: :class:`RunReply`."""

    shard: str
    command: Command


class FetchState(msgspec.Struct, tag="fetch_state", **_OPTS):
    """The shard's latest state. Answer: :class:`StateReply`."""

    shard: str


class WaitForUpper(msgspec.Struct, tag="wait_for_upper", **_OPTS):
    """A long poll: answered with :class:`StateReply` as soon as the shard's
    upper is past ``past``, or after ``timeout_ms`` with the state as it is."""

    shard: str
    past: int
    timeout_ms: int


class Maintain(msgspec.Struct, tag="maintain", **_OPTS):
    """Run one maintenance ``job`` of ``shard`` in the server (its own
    writer's compaction, GC, or the leaked-blob sweep with ``grace_ms``,
    ``None``: the server's grace; never shorter than its writer lease), off
    the request loop. Answer: :class:`MaintainedReply` once it is done."""

    shard: str
    job: Literal["compact", "gc", "sweep"]
    grace_ms: int | None = None


class GetStats(msgspec.Struct, tag="get_stats", **_OPTS):
    """Per-shard counters of this server. Answer: :class:`StatsReply`."""


class ScanVersions(msgspec.Struct, tag="scan_versions", **_OPTS):
    """Stored versions of ``shard`` from ``from_seqno`` on, oldest first, at
    most ``limit`` (the server may send fewer). Answer: :class:`VersionsReply`."""

    shard: str
    from_seqno: int
    limit: int


Request = (
    Ping | OpenShard | RunCommand | FetchState | WaitForUpper | Maintain | GetStats | ScanVersions
)


# --- replies ------------------------------------------------------------------


class Pong(msgspec.Struct, tag="pong", **_OPTS):
    """The server is up; ``pid`` identifies its process."""

    pid: int


class StateReply(msgspec.Struct, tag="state", **_OPTS):
    state: ShardState


class OpenedReply(msgspec.Struct, tag="opened", **_OPTS):
    """The opened shard's latest ``state``, and the writer lease this server
    expires writers by (a client heartbeats its writers by it)."""

    state: ShardState
    writer_lease_ms: int


class RunReply(msgspec.Struct, tag="ran", **_OPTS):
    """``result`` of the command and the state-storage work it caused."""

    result: Result
    work: MachineStats


class MaintainedReply(msgspec.Struct, tag="maintained", **_OPTS):
    """What a :class:`Maintain` job did: its compaction's or GC's report, or
    the blobs and temporary files the sweep removed."""

    compaction: CompactionReport | None = None
    gc: GcReport | None = None
    swept: tuple[str, ...] = ()


class Version(msgspec.Struct, **_OPTS):
    """One stored version: its seqno and its state diff, encoded."""

    seqno: int
    data: bytes


class VersionsReply(msgspec.Struct, tag="versions", **_OPTS):
    versions: tuple[Version, ...]


class ShardCounters(msgspec.Struct, **_OPTS):
    """What the server did for one shard since it started, and the size of
    its latest state (``batches``, ``parts``, ``inline_bytes``, ``readers``).
    Compaction's counts: ``compactions`` applied, replacing
    ``compacted_batches`` batches with one each, ``compactions_abandoned``
    (inputs gone or changed), and the data parts they wrote
    (``compaction_puts``, ``compaction_put_bytes``)."""

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


class StatsReply(msgspec.Struct, tag="stats", **_OPTS):
    pid: int
    requests: int
    errors: int
    dropped: int
    shards: tuple[ShardCounters, ...]


class ErrorReply(msgspec.Struct, tag="error", **_OPTS):
    """The request failed. ``kind`` (one of :data:`ERROR_KINDS`, or
    ``internal``) says how the client should raise it; ``bad_request`` means
    malformed or invalid, nothing happened."""

    kind: str
    message: str


Reply = (
    Pong
    | StateReply
    | OpenedReply
    | RunReply
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


REQUEST_DECODER = msgspec.msgpack.Decoder(Request)
REPLY_DECODER = msgspec.msgpack.Decoder(Reply)
ENCODER = msgspec.msgpack.Encoder()
