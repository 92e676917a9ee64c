"""Compact diffs between consecutive state versions.

Consensus stores every version as a :class:`StateDiff` against the one before;
each diff also names the latest rollup, so any stored version is rebuilt by
fetching that rollup from blob and applying the later diffs in order.
"""

from __future__ import annotations

import msgspec

from ..storage import VersionedData
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


def next_version(state: ShardState, **changes: object) -> tuple[ShardState, StateDiff]:
    """The version after ``state`` with ``changes`` made, and its diff.
    ``changes`` are named as :class:`StateDiff`'s fields: a scalar's new
    value, a map ``F``'s entries put (``F_put``) and keys removed
    (``F_del``). The diff holds only what differs from ``state`` (an entry
    equal to the one it replaces, a key that is not there or an unchanged
    scalar is left out), and building it costs what changed, never the size
    of the state's maps: a consensus server builds one per append.
    ``TypeError`` for a name that is not such a field."""
    kept: dict[str, object] = {}
    for name, value in changes.items():
        if name in SCALAR_FIELDS:
            if getattr(state, name) != value:
                kept[name] = value
            continue
        field, _, kind = name.rpartition("_")
        if field not in MAP_FIELDS or kind not in ("put", "del"):
            raise TypeError(f"next_version: {name!r} is not a field of a state diff")
        before = getattr(state, field)
        if kind == "put":
            put = {k: v for k, v in value.items() if (was := before.get(k)) is not v and was != v}
            if put:
                kept[name] = put
        else:
            gone = tuple(k for k in value if k in before)
            if gone:
                kept[name] = gone
    d = StateDiff(shard=state.shard, seqno=state.seqno + 1, rollup=state.latest_rollup(), **kept)
    new = apply_diff(state, d)
    if "rollups_put" in kept or "rollups_del" in kept:
        d = msgspec.structs.replace(d, rollup=new.latest_rollup())
    return new, d


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
            merged = dict(getattr(state, name))
            for key in gone:
                merged.pop(key, None)
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
