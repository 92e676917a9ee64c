"""Compact diffs between consecutive state versions.

Consensus stores every version as a :class:`StateDiff` against the one before;
each diff also names the latest rollup, so any stored version is rebuilt by
fetching that rollup from blob and applying the later diffs in order.
"""

from __future__ import annotations

import msgspec

from ..storage.contracts import VersionedData
from .errors import CorruptState
from .state import Batch, ReaderState, RollupRef, ShardState, WriterState

#: Fields fixed when the shard is created; a diff never changes them.
FIXED_FIELDS = ("shard", "schema", "inline_max_bytes", "inline_total_max_bytes")
#: Scalar fields a diff carries when they change.
SCALAR_FIELDS = ("upper", "since", "inline_bytes")
#: Dict fields a diff carries as upserted entries plus removed keys.
MAP_FIELDS = ("batches", "writers", "readers", "rollups", "retired")


class StateDiff(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The change from version ``seqno - 1`` to version ``seqno``.

    ``rollup`` is the latest rollup as of ``seqno``. Scalars are ``None`` when
    unchanged; each map field ``F`` has ``F_put`` (new or changed entries) and
    ``F_del`` (removed keys).
    """

    shard: str
    seqno: int
    rollup: RollupRef
    upper: int | None = None
    since: int | None = None
    inline_bytes: int | None = None
    batches_put: dict[str, Batch] = {}
    batches_del: tuple[str, ...] = ()
    writers_put: dict[str, WriterState] = {}
    writers_del: tuple[str, ...] = ()
    readers_put: dict[str, ReaderState] = {}
    readers_del: tuple[str, ...] = ()
    rollups_put: dict[int, RollupRef] = {}
    rollups_del: tuple[int, ...] = ()
    retired_put: dict[int, tuple[str, ...]] = {}
    retired_del: tuple[int, ...] = ()


_DECODER = msgspec.msgpack.Decoder(StateDiff)
_ENCODER = msgspec.msgpack.Encoder()


def diff(old: ShardState, new: ShardState) -> StateDiff:
    """The diff turning ``old`` into ``new``. ``ValueError`` unless ``new`` is
    the next version of the same shard with the same fixed fields."""
    if new.seqno != old.seqno + 1:
        raise ValueError(f"diff: version {new.seqno} does not follow version {old.seqno}")
    for name in FIXED_FIELDS:
        if getattr(old, name) != getattr(new, name):
            raise ValueError(f"diff: field {name!r} of shard {old.shard!r} may not change")
    changes: dict[str, object] = {}
    for name in SCALAR_FIELDS:
        if getattr(old, name) != getattr(new, name):
            changes[name] = getattr(new, name)
    for name in MAP_FIELDS:
        before, after = getattr(old, name), getattr(new, name)
        if before is after:
            continue
        put = {k: v for k, v in after.items() if before.get(k) is not v and before.get(k) != v}
        gone = tuple(k for k in before if k not in after)
        if put:
            changes[f"{name}_put"] = put
        if gone:
            changes[f"{name}_del"] = gone
    return StateDiff(shard=new.shard, seqno=new.seqno, rollup=new.latest_rollup(), **changes)


def apply_diff(state: ShardState, d: StateDiff) -> ShardState:
    """The version ``d`` describes, given the version before it. ``ValueError``
    if ``d`` belongs to another shard or does not follow ``state``."""
    if d.shard != state.shard or d.seqno != state.seqno + 1:
        raise ValueError(
            f"diff for shard {d.shard!r} version {d.seqno} does not apply to shard "
            f"{state.shard!r} version {state.seqno}"
        )
    changes: dict[str, object] = {"seqno": d.seqno}
    for name in SCALAR_FIELDS:
        value = getattr(d, name)
        if value is not None:
            changes[name] = value
    for name in MAP_FIELDS:
        put, gone = getattr(d, f"{name}_put"), getattr(d, f"{name}_del")
        if put or gone:
            merged = {k: v for k, v in getattr(state, name).items() if k not in gone}
            merged.update(put)
            changes[name] = merged
    return msgspec.structs.replace(state, **changes)


def encode_diff(d: StateDiff) -> bytes:
    return _ENCODER.encode(d)


def decode_diff(data: bytes) -> StateDiff:
    """Decode a stored diff strictly; ``msgspec.DecodeError`` if it is not one."""
    return _DECODER.decode(data)


def decode_version(shard: str, version: VersionedData) -> StateDiff:
    """The diff stored as ``version`` of ``shard``; :class:`CorruptState`
    naming both if it is not a state diff, or the diff of another shard or
    version."""
    try:
        d = decode_diff(version.data)
    except msgspec.DecodeError as exc:
        raise CorruptState(
            f"shard {shard!r}: version {version.seqno} is not a state diff: {exc}"
        ) from None
    if d.seqno != version.seqno or d.shard != shard:
        raise CorruptState(
            f"shard {shard!r}: version {version.seqno} holds the diff of shard "
            f"{d.shard!r} version {d.seqno}"
        )
    return d
