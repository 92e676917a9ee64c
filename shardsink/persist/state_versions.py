"""The durable, truncatable log of a shard's versions: its states as diffs in
a consensus store, with rollups in blob (Materialize persist's
``state_versions``, beside the machine that applies commands).

Invariants (each kept here, checked by the shard machine's tests and the
kill and chaos suites):

- **A version is a diff of the one before.** Version ``n`` is stored at
  seqno ``n`` only by a compare-and-set expecting ``n - 1`` (version 0
  expecting nothing), so among racing writers exactly one adds each
  version, and the head never goes backwards.
- **Every version can be rebuilt** from a rollup at or below it (a whole
  state encoded in blob under a key unique to the attempt, so a losing
  writer never overwrites the winner's) and the diffs after it. Version 0
  names its own rollup, stored just before it; later rollups are written
  once the latest is ``rollup_threshold`` versions old and recorded by a
  command of their own (the machine's).
- **Truncation keeps what a rebuild needs**: versions are dropped only
  below a seqno that has a rollup (or below the oldest one kept).
- **A lost store is refused, not recreated**: a shard with no version in
  consensus whose parts or rollups are in blob raises
  :class:`~.errors.StateMissing` rather than starting over on top of them.
- **A rebuild follows a moving head**: GC may truncate versions a rebuild
  from an old head needs once the head has moved past them, so a failed
  rebuild re-reads the head and rebuilds from the newer one; a failure at a
  head that did not move is :class:`~.errors.CorruptState`.

The log does no locking of its own: its one user, the shard machine, calls
it under its lock. It counts its work in the machine's
:class:`~.stats.MachineStats`.
"""

from __future__ import annotations

import random
import time
import uuid

import msgspec

from ..storage import Blob, Committed, Consensus, StorageError, VersionedData
from .config import ShardConfig
from .diff import StateDiff, apply_diff, decode_version, encode_diff
from .errors import Contended, CorruptState, ShardNotFound, StateMissing
from .state import RollupRef, ShardState, decode_state, encode_state
from .stats import MachineStats
from .transitions import initial_state

_SCAN_PAGE = 512
#: How long a version-0 rollup may be another creator's in flight (it
#: stores it, then version 0, within milliseconds): younger, it is no
#: evidence that consensus lost the shard.
CREATE_RACE_S = 60.0


def rollup_key(shard: str, seqno: int) -> str:
    """A fresh blob key for a rollup of ``seqno``: unique per attempt, so a
    losing writer can never overwrite the winner's rollup."""
    return f"{shard}/rollup/{seqno:020d}-{uuid.uuid4().hex}"


class StateVersions:
    """Shard ``shard``'s versions in ``consensus`` and its rollups in
    ``blob`` (neither closed here), counted in ``stats``."""

    def __init__(
        self,
        consensus: Consensus,
        blob: Blob,
        shard: str,
        config: ShardConfig,
        stats: MachineStats,
    ) -> None:
        self.shard = shard
        self.consensus = consensus
        self.blob = blob
        self._config = config
        self._stats = stats

    def load(self, schema: bytes, create: bool) -> ShardState:
        """The latest state; a shard without a version is created with
        ``schema`` if ``create``, else :class:`ShardNotFound`. Storage errors
        are retried up to ``max_attempts`` times, the last one raised."""
        error: Exception | None = None
        for attempt in range(self._config.max_attempts):
            try:
                head = self.consensus.head(self.shard)
                if head is None:
                    self._refuse_orphaned_blobs()
                    # a creator may have stored version 0 and appended meanwhile
                    head = self.consensus.head(self.shard)
                if head is not None:
                    return self.rebuild_latest(head)
                if not create:
                    raise ShardNotFound(
                        f"shard {self.shard!r} does not exist in consensus {self.consensus.uri}"
                    )
                created = self._create(schema)
                if created is not None:
                    return created
            except StorageError as exc:
                error = exc
            backoff(attempt)
        raise error or Contended(f"shard {self.shard!r}: could not create or load its state")

    def compare_and_set(self, expected: int | None, version: VersionedData) -> bool:
        """Store ``version`` iff the head is ``expected``; whether it did."""
        self._stats.cas_calls += 1
        result = self.consensus.compare_and_set(self.shard, expected, version)
        if isinstance(result, Committed):
            self.count_committed(version)
            return True
        self._stats.cas_mismatches += 1
        return False

    def count_committed(self, version: VersionedData) -> None:
        """Count ``version`` as stored (by this log's compare-and-set, or a
        grouped one of the consensus server's or a transaction's)."""
        self._stats.versions += 1
        self._stats.diff_bytes += len(version.data)
        self._stats.last_diff_bytes = len(version.data)

    def put_rollup(self, key: str, state: ShardState) -> None:
        """Store ``state`` whole in blob under ``key``."""
        data = encode_state(state)
        self.blob.set(key, data)
        self._stats.rollup_puts += 1
        self._stats.rollup_bytes += len(data)

    def latest(self, current: ShardState) -> ShardState:
        """The state at (at least) the head, from ``current``: the diffs after
        it, or a rebuild from a rollup when they are truncated.
        :class:`CorruptState` if the head is missing or behind ``current``."""
        head = self.consensus.head(self.shard)
        if head is None:
            raise CorruptState(f"shard {self.shard!r} has no version in {self.consensus.uri}")
        if head.seqno < current.seqno:
            raise CorruptState(
                f"shard {self.shard!r}: consensus head {head.seqno} is behind the known "
                f"version {current.seqno}"
            )
        if head.seqno == current.seqno:
            return current
        caught = self._catch_up(current)
        if caught is None or caught.seqno < head.seqno:
            caught = self.rebuild_latest(head)
        return caught

    def rebuild_latest(self, head: VersionedData) -> ShardState:
        """The state at ``head`` or a later head (see the module doc)."""
        attempts = 1
        while True:
            try:
                return self._rebuild(head)
            except CorruptState:
                newer = self.consensus.head(self.shard)
                moved = newer is not None and newer.seqno > head.seqno
                if not moved or attempts >= self._config.max_attempts:
                    raise
                head, attempts = newer, attempts + 1

    def truncate_below(self, seqno: int, rollups: dict[int, RollupRef]) -> int:
        """Drop stored versions below ``seqno``, which must be one of
        ``rollups`` (the state's) or at or below the oldest of them, else
        ``ValueError``; return how many."""
        # below the oldest kept rollup, versions are no longer rebuildable anyway
        if seqno not in rollups and seqno > min(rollups):
            raise ValueError(
                f"shard {self.shard!r}: no rollup at seqno {seqno}; truncating below it "
                "would leave versions that cannot be rebuilt"
            )
        return self.consensus.truncate(self.shard, seqno)

    def scan(self, from_seqno: int, limit: int) -> list[VersionedData]:
        """Stored versions from ``from_seqno`` up, at most ``limit``."""
        return self.consensus.scan(self.shard, from_seqno, limit)

    # --- internals --------------------------------------------------------------

    def _refuse_orphaned_blobs(self) -> None:
        """:class:`StateMissing` if the blob store holds parts or rollups of
        this shard, which consensus does not know (it was just found without
        a version). A creator stores its version-0 rollup just before version
        0, so one younger than :data:`CREATE_RACE_S` may be a racing opener's
        and is no evidence; an older one is (of a store emptied after
        version 0, or of a creator that died between the two)."""
        first = rollup_key(self.shard, 0).rsplit("-", 1)[0]
        recent = time.time() - CREATE_RACE_S
        found = []
        for meta in self.blob.list_meta(f"{self.shard}/"):
            if not (meta.key.startswith(first) and meta.modified > recent):
                found.append(meta.key)
                if len(found) == 3:
                    break
        if not found:
            return
        if self.consensus.head(self.shard) is not None:
            return  # created meanwhile: these are its
        raise StateMissing(
            f"consensus {self.consensus.uri} has no state of shard {self.shard!r}, but blob "
            f"{self.blob.uri} holds its parts or rollups (e.g. {', '.join(found)}): was the "
            "consensus store emptied, replaced or deleted? Nothing was changed. Restore it or "
            f"point at the right one; to start over instead, delete everything under "
            f"{self.shard}/ in that blob store (or use another shard name)"
        )

    def _create(self, schema: bytes) -> ShardState | None:
        """Try to store version 0: its state, or ``None`` if another opener
        stored one first."""
        key = rollup_key(self.shard, 0)
        config = self._config
        state = initial_state(
            self.shard, schema, config.inline_max_bytes, config.inline_total_max_bytes, key
        )
        self.put_rollup(key, state)
        first = StateDiff(shard=self.shard, seqno=0, rollup=RollupRef(0, key))
        if self.compare_and_set(None, VersionedData(0, encode_diff(first))):
            return state
        self.blob.delete(key)
        return None

    def _catch_up(self, state: ShardState) -> ShardState | None:
        """``state`` advanced by every later stored diff, or ``None`` if some
        are already truncated (then only a rollup can help)."""
        while True:
            versions = self.consensus.scan(self.shard, state.seqno + 1, _SCAN_PAGE)
            if not versions:
                return state
            if versions[0].seqno != state.seqno + 1:
                return None
            for version in versions:
                state = apply_diff(state, decode_version(self.shard, version))

    def _rebuild(self, head: VersionedData) -> ShardState:
        """The state at ``head``: its latest rollup plus the diffs after it."""
        self._stats.rebuilds += 1
        rollup = decode_version(self.shard, head).rollup
        data = self.blob.get(rollup.key)
        if data is None:
            raise CorruptState(
                f"shard {self.shard!r}: rollup {rollup.key!r} named by version {head.seqno} "
                "is missing from blob"
            )
        try:
            state = decode_state(data)
        except msgspec.DecodeError as exc:
            raise CorruptState(f"shard {self.shard!r}: rollup {rollup.key!r}: {exc}") from None
        if state.shard != self.shard or state.seqno != rollup.seqno:
            raise CorruptState(
                f"rollup {rollup.key!r} holds shard {state.shard!r} version {state.seqno}, "
                f"not shard {self.shard!r} version {rollup.seqno}"
            )
        caught = self._catch_up(state)
        if caught is None or caught.seqno < head.seqno:
            raise CorruptState(
                f"shard {self.shard!r}: versions after rollup {rollup.seqno} are missing; "
                f"cannot rebuild version {head.seqno}"
            )
        return caught


def backoff(attempt: int) -> None:
    """Sleep a jittered, exponentially growing pause (at most ~50 ms)."""
    time.sleep(random.uniform(0.5, 1.0) * min(0.0005 * 2**attempt, 0.05))
