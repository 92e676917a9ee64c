"""The shard's state: plain msgspec Structs, encoded as MessagePack.

A state version is immutable. Collections are dicts keyed by id so that a
version differs from the one before by a few entries (see ``diff.py``);
transitions build new dicts and never mutate an existing one.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from .digest import Digest

_SHARD_RE = re.compile(r"^[A-Za-z0-9_=-][A-Za-z0-9_.=-]*$")

#: A part's key bound: the smallest/largest value of its ``key`` column, when
#: that column's type has a MessagePack-native value (ints, floats, strings).
KeyBound = int | float | str | None


def check_shard_name(name: str) -> str:
    """Return ``name`` if it can name a shard, else raise ``ValueError``.

    A shard name is one blob-key segment: ``[A-Za-z0-9_.=-]``, not starting
    with ``.``, at most 200 characters.
    """
    if not isinstance(name, str) or len(name) > 200 or not _SHARD_RE.match(name):
        raise ValueError(
            f"invalid shard name {name!r}: expected 1-200 characters of [A-Za-z0-9_.=-], "
            "not starting with '.'"
        )
    return name


def part_prefix(shard: str, writer_id: str) -> str:
    """Where writer ``writer_id`` of ``shard`` stores its data parts: every
    blob part a compare-and-append (or a compaction) commits lies under its
    writer's prefix, so what a writer wrote is told from the key alone (the
    leaked-blob sweep spares a live writer's parts; no writer can commit, and
    so have deleted, another's)."""
    return f"{shard}/part/{writer_id}/"


def part_writer(shard: str, key: str) -> str | None:
    """The writer whose prefix (:func:`part_prefix`) ``key`` lies under;
    ``None`` for a key that is not a writer's part (a rollup, or a part of a
    version before writer prefixes, ``<shard>/part/<uuid>.parquet``)."""
    head = f"{shard}/part/"
    if not key.startswith(head):
        return None
    writer, slash, _ = key[len(head) :].partition("/")
    return writer if slash else None


class BlobPart(msgspec.Struct, frozen=True, tag="blob", forbid_unknown_fields=True):
    """A Parquet part stored in blob under ``key`` (``encoded_bytes`` long)."""

    key: str
    encoded_bytes: int
    rows: int
    ts_lo: int
    ts_hi: int
    key_lo: KeyBound = None
    key_hi: KeyBound = None


#: How an inline part's ``data`` holds its message: as it is (what earlier
#: versions stored), or as one zstd frame (what this version stores).
InlineCodec = Literal["none", "zstd"]


class InlinePart(
    msgspec.Struct, frozen=True, tag="inline", forbid_unknown_fields=True, omit_defaults=True
):
    """A small part stored in state: one Arrow IPC record-batch message (no
    schema: it is the shard's, stored once in :class:`ShardState`),
    compressed as a whole (``codec`` ``"zstd"``, ``size`` the message's bytes
    once decompressed; see :func:`~shardsink.persist.parts.inline_part`).

    Parts stored by earlier versions lack ``codec`` and ``size`` and read as
    uncompressed messages (``"none"``), so their shards stay readable; a
    version before this one refuses a part that has them (unknown fields).
    """

    data: bytes
    rows: int
    ts_lo: int
    ts_hi: int
    key_lo: KeyBound = None
    key_hi: KeyBound = None
    codec: InlineCodec = "none"
    size: int = 0

    @property
    def encoded_bytes(self) -> int:
        return len(self.data)


Part = BlobPart | InlinePart


class Batch(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Updates with ``lower <= ts < upper`` (before any forwarding to ``since``),
    in ``parts``. ``id`` is unique within the shard. ``digest``: the
    :class:`~.digest.Digest` of what was written into it (a compaction's is
    the sum of its inputs'), ``None`` if unknown (batches of earlier versions)."""

    id: str
    lower: int
    upper: int
    parts: tuple[Part, ...]
    rows: int
    digest: Digest | None = None

    @property
    def inline_bytes(self) -> int:
        return sum(len(p.data) for p in self.parts if isinstance(p, InlinePart))

    @property
    def encoded_bytes(self) -> int:
        return sum(p.encoded_bytes for p in self.parts)

    def blob_keys(self) -> list[str]:
        return [p.key for p in self.parts if isinstance(p, BlobPart)]


class WriterState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A writer's last compare-and-append: its idempotency ``token`` and the
    ``upper`` it produced; ``heartbeat_ms`` is when the writer was last seen."""

    token: str
    upper: int
    heartbeat_ms: int


class ReaderState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A leased reader: no blob referenced by a version ``>= seqno_hold`` is
    deleted while ``heartbeat_ms + lease_ms`` has not passed. ``upper_hold``
    is the upper of the version it holds: retention keeps the times that
    version kept readable (see :func:`~shardsink.persist.transitions.retention_since`)."""

    seqno_hold: int
    heartbeat_ms: int
    lease_ms: int
    upper_hold: int = 0

    def expired(self, now_ms: int) -> bool:
        return now_ms > self.heartbeat_ms + self.lease_ms


class RollupRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The full state at ``seqno`` is stored in blob under ``key``."""

    seqno: int
    key: str


class ShardState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One version of a shard.

    - ``schema``: the Arrow schema (``key``, ``val``, ``ts: uint64``,
      ``diff: int64``), IPC-serialized.
    - ``upper``: every time below it is written; ``since``: times below it may
      have been merged forward to ``since``.
    - ``batches`` by id; ``writers`` and ``readers`` by their ids.
    - ``rollups`` by seqno: rollups that may still be needed to rebuild a
      version held by a reader.
    - ``retired``: blob keys no longer referenced from the version ``seqno``
      on (keyed by that seqno); deletable once no reader holds a seqno below it.
    - ``inline_bytes``: running total of the inline parts' bytes.
    """

    shard: str
    seqno: int
    schema: bytes
    inline_max_bytes: int
    inline_total_max_bytes: int
    upper: int = 0
    since: int = 0
    inline_bytes: int = 0
    batches: dict[str, Batch] = {}
    writers: dict[str, WriterState] = {}
    readers: dict[str, ReaderState] = {}
    rollups: dict[int, RollupRef] = {}
    retired: dict[int, tuple[str, ...]] = {}

    def ordered_batches(self) -> list[Batch]:
        """Batches in time order (by ``lower``, then ``upper``, then id)."""
        return sorted(self.batches.values(), key=lambda b: (b.lower, b.upper, b.id))

    def seqno_hold(self) -> int:
        """The smallest seqno any registered reader holds (the head if none)."""
        return min((r.seqno_hold for r in self.readers.values()), default=self.seqno)

    def latest_rollup(self) -> RollupRef:
        """The newest rollup (every state has at least the one of version 0)."""
        return self.rollups[max(self.rollups)]

    def live_keys(self) -> set[str]:
        """The blob keys this version reads: its batches' parts and its rollups."""
        keys = {k for b in self.batches.values() for k in b.blob_keys()}
        keys.update(r.key for r in self.rollups.values())
        return keys

    def referenced_keys(self) -> set[str]:
        """Every blob key this version may still need: live ones, and retired
        ones that readers of older versions may hold."""
        keys = self.live_keys()
        keys.update(k for ks in self.retired.values() for k in ks)
        return keys


STATE_DECODER = msgspec.msgpack.Decoder(ShardState)
ENCODER = msgspec.msgpack.Encoder()


def encode_state(state: ShardState) -> bytes:
    return ENCODER.encode(state)


def decode_state(data: bytes) -> ShardState:
    """Decode a rollup strictly; ``msgspec.DecodeError`` if it is not a state."""
    return STATE_DECODER.decode(data)
