"""The shard machine: applies commands to a shard's state, durably.

:class:`ShardMachine` is what a shard handle needs from the machinery that
owns the state; :class:`LocalMachine` implements it in-process over a
``Consensus`` and a ``Blob`` store. A remote machine (a consensus server
applying the same commands) implements the same protocol.

``LocalMachine`` keeps the latest state it knows, applies a command with the
pure :func:`~shardsink.persist.transitions.step`, and stores the new version
as the diff it gives with ``compare_and_set``. On a mismatch it catches up by
scanning the diffs it missed and re-applies; on an indeterminate outcome it
re-reads the head and re-applies, and the command's idempotence (for
appends: the writer's token) decides whether it already took effect. The
versions themselves, how they are stored, rebuilt and truncated, are
:mod:`.state_versions`' (the durable log, its invariants in its docstring);
this module is the apply loop over it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import msgspec
import pyarrow as pa

from ..storage import (
    Blob,
    CasResult,
    Committed,
    Consensus,
    IndeterminateError,
    Mismatch,
    StorageError,
    VersionedData,
)
from .commands import AddRollup, ApplyCompaction, Command, CompareAndAppend, PartsMissing, Result
from .config import ShardConfig
from .diff import encode_diff
from .errors import Contended
from .parts import full_schema, schema_from_bytes
from .state import (
    BlobPart,
    ShardState,
    check_shard_name,
)
from .state_versions import StateVersions, backoff, rollup_key
from .stats import MachineStats
from .transitions import Step, step

log = logging.getLogger(__name__)


class Prepared(msgspec.Struct, frozen=True):
    """A command applied to the cached state, its version not yet stored
    (:meth:`LocalMachine.prepare`), with the machine's counts before it."""

    command: Command
    old: ShardState
    new: ShardState
    result: Result
    version: VersionedData
    before: MachineStats


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@runtime_checkable
class ShardMachine(Protocol):
    """The state machine of one shard, as a shard handle uses it.

    - ``run(command)`` applies ``command`` to the latest state, durably and
      linearizably, and returns its result (a ``Result`` Struct); storage
      failures that outlast the machine's retries are raised
      (``StorageError``), as is :class:`~.errors.Contended`.
    - ``state(refresh)`` is the latest state known; with ``refresh`` it is at
      least as new as the head when the call began (storage failures are
      retried as for ``run``).
    - ``wait_for_upper_past(upper, timeout)`` returns a state whose upper is
      greater than ``upper``, or raises ``TimeoutError`` after ``timeout``
      seconds (``None``: wait forever).
    - ``versions(from_seqno, limit)`` is the stored versions (state diffs)
      with ``seqno >= from_seqno``, oldest first: at least one while any is
      left, at most ``limit`` (``ValueError`` below 1). Versions truncated
      below the oldest needed rollup are gone.
    - ``stats()`` counts the state-storage work; ``close()`` is idempotent.
    - ``config`` is the handle's configuration (its ``writer_lease_ms`` is
      the lease maintenance expires writers by).
    """

    shard: str
    config: ShardConfig

    def run(self, command: Command) -> Result: ...

    def state(self, refresh: bool = False) -> ShardState: ...

    def wait_for_upper_past(self, upper: int, timeout: float | None) -> ShardState: ...

    def versions(self, from_seqno: int, limit: int) -> list[VersionedData]: ...

    def stats(self) -> MachineStats: ...

    def close(self) -> None: ...


class LocalMachine:
    """A :class:`ShardMachine` in this process over ``consensus`` and ``blob``
    (neither is closed by the machine). Thread-safe. Use :meth:`open`.

    ``exclusive`` promises that no one else writes this shard's versions (a
    consensus server owns the store): the cache is then the head, so a
    command that changes nothing is answered, and ``state(refresh=True)``
    returns, without a store round trip. Breaking the promise cannot corrupt
    the shard (every commit is still a compare-and-set) but may answer a
    no-op from a stale state.

    ``check_parts`` (on by default) makes every append and compaction first
    look that its blob parts exist (:meth:`_missing_parts`); off only to
    measure what the look costs (``bench appends --part-checks both``)."""

    def __init__(
        self,
        consensus: Consensus,
        blob: Blob,
        shard: str,
        config: ShardConfig,
        clock: Callable[[], int] = wall_clock_ms,
        exclusive: bool = False,
        check_parts: bool = True,
    ) -> None:
        self.shard = shard
        self.exclusive = exclusive
        self.check_parts = check_parts
        self._blob = blob
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._stats = MachineStats()
        self._versions = StateVersions(consensus, blob, shard, config, self._stats)
        self._state: ShardState | None = None
        self._suspect = False
        self._closed = False

    @classmethod
    def open(
        cls,
        consensus: Consensus,
        blob: Blob,
        shard: str,
        *,
        schema: bytes,
        config: ShardConfig,
        create: bool = True,
        clock: Callable[[], int] = wall_clock_ms,
        exclusive: bool = False,
        check_parts: bool = True,
    ) -> LocalMachine:
        """A machine holding the shard's latest state. A shard without state
        is created with ``schema`` if ``create``, else :class:`ShardNotFound`.

        ``ValueError`` for an invalid shard name, or (when creating) a
        ``schema`` that is not a serialized shard schema."""
        check_shard_name(shard)
        if create:
            _check_schema(schema)
        machine = cls(consensus, blob, shard, config, clock, exclusive, check_parts)
        machine._state = machine._versions.load(schema, create)
        return machine

    # --- the protocol ---------------------------------------------------------

    def run(self, command: Command) -> Result:
        with self._lock:
            self._check_open()
            # after a failed run the cache may predate a commit of ours: re-read first
            refresh, refreshed = self._suspect, False
            failures = 0
            error: Exception | None = None
            checked: set[str] = set()  # parts found in blob, once per run
            while True:
                try:
                    if refresh:
                        self._refresh()
                        refresh, refreshed = False, True
                    state = self._state
                    made, result = step(state, command, self._clock())
                    if made is None:
                        if refreshed or self.exclusive:
                            return result
                        # decided on a cached state: confirm against the head
                        refresh = True
                        continue
                    missing = self._missing_parts(command, checked)
                    if missing is not None:
                        return missing
                    if self._commit(state, made):
                        self._after_commit(made.new)
                        return result
                    error = None
                except IndeterminateError as exc:
                    self._stats.indeterminate += 1
                    error = exc
                except StorageError as exc:
                    error = exc
                failures += 1
                if failures >= self.config.max_attempts:
                    break
                refresh = True
                backoff(failures)
            self._suspect = True
            if error is not None:
                raise error
            raise Contended(
                f"shard {self.shard!r}: {type(command).__name__} lost "
                f"{self.config.max_attempts} compare-and-sets in a row"
            )

    def run_measured(self, command: Command) -> tuple[Result, MachineStats]:
        """:meth:`run`, and the work it did alone (other threads wait for it)."""
        with self._lock:
            before = self.stats()
            result = self.run(command)
            return result, self.stats() - before

    @contextlib.contextmanager
    def preparing(
        self, command: Command, *, fresh: bool = False
    ) -> Iterator[Prepared | Result | None]:
        """The first half of a grouped commit (a consensus server's, which
        stores the versions of many shards' commands in one
        ``compare_and_set_many``, or a transaction's): ``command`` applied
        to the cached state, this machine's lock held for the block, so no
        other command lands between the version prepared and its store.

        A :class:`Prepared` holds the version to store; it must be given to
        :meth:`finish` (with the store's outcome) or :meth:`abandon` inside
        the block. A ``Result`` is the command's answer without a commit (a
        no-op, or :class:`~.commands.PartsMissing`). ``None``: this machine
        cannot group it (not ``exclusive``, or its cache may predate a
        commit after a failed run): :meth:`run_measured` it; with ``fresh``,
        the state is re-read from the head first instead (a transaction
        across shards, :mod:`.transactions`, prepares each of its shards so).
        Errors as :meth:`run`'s, the lock released."""
        with self._lock:
            yield self._prepare(command, fresh)

    def _prepare(self, command: Command, fresh: bool) -> Prepared | Result | None:
        self._check_open()
        if not self.exclusive or self._suspect:
            if not fresh:
                return None
            self._refresh_retrying()
            self._suspect = False
        before = self.stats()
        state = self._state
        made, result = step(state, command, self._clock())
        missing = None if made is None else self._missing_parts(command, set())
        if made is None or missing is not None:
            return result if missing is None else missing
        version = VersionedData(made.new.seqno, encode_diff(made.diff))
        return Prepared(command, state, made.new, result, version, before)

    def finish(
        self, prepared: Prepared, outcome: CasResult | Exception
    ) -> tuple[Result, MachineStats]:
        """The second half, inside :meth:`preparing`'s block: ``outcome`` is
        what storing ``prepared.version`` at ``prepared.old.seqno`` returned
        or raised. Committed: the new state is this machine's; otherwise the
        command runs again as :meth:`run` does (from a re-read head: it may
        have committed). Returns as :meth:`run_measured`."""
        with self._lock:  # held already by this thread, in preparing's block
            self._stats.cas_calls += 1
            if isinstance(outcome, Committed):
                self._versions.count_committed(prepared.version)
                self._state = prepared.new
                self._after_commit(prepared.new)
                return prepared.result, self.stats() - prepared.before
            if isinstance(outcome, Mismatch):
                self._stats.cas_mismatches += 1
            elif isinstance(outcome, IndeterminateError):
                self._stats.indeterminate += 1
            elif not isinstance(outcome, StorageError):
                raise outcome
            self._suspect = True
            result = self.run(prepared.command)
            return result, self.stats() - prepared.before

    def abandon(self, prepared: Prepared, *, tried: bool) -> None:
        """Let ``prepared`` go without storing it, inside :meth:`preparing`'s
        block; ``tried``: after a store that did not commit it (a mismatch,
        an error), so the cache may now predate the head and the next
        command re-reads it."""
        with self._lock:
            self._suspect = self._suspect or tried

    def state(self, refresh: bool = False) -> ShardState:
        with self._lock:
            self._check_open()
            # after a failed run even an exclusive cache may predate a commit
            if refresh and (self._suspect or not self.exclusive):
                self._refresh_retrying()
            return self._state

    def wait_for_upper_past(self, upper: int, timeout: float | None) -> ShardState:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while True:
            state = self.state(refresh=True)
            if state.upper > upper:
                return state
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"shard {self.shard!r}: upper stayed at {state.upper}, not past {upper}, "
                    f"for {timeout} s"
                )
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))
            delay = min(delay * 2, 0.05)

    def truncate_below(self, seqno: int) -> int:
        """Drop stored versions below ``seqno`` (which must have a rollup, or
        be at or below the oldest rollup; else ``ValueError``); return how
        many. Garbage collection's, by the owner of the shard's state."""
        with self._lock:
            self._check_open()
            return self._versions.truncate_below(seqno, self._state.rollups)

    def versions(self, from_seqno: int, limit: int) -> list[VersionedData]:
        if limit < 1:
            raise ValueError(f"versions: limit must be >= 1, got {limit}")
        with self._lock:
            self._check_open()
            return self._versions.scan(from_seqno, limit)

    def stats(self) -> MachineStats:
        with self._lock:
            return msgspec.structs.replace(self._stats)

    def close(self) -> None:
        self._closed = True

    # --- internals --------------------------------------------------------------

    def _missing_parts(self, command: Command, checked: set[str]) -> PartsMissing | None:
        """Before a command that adds blob parts commits them: each exists in
        blob with its recorded length (one ``stat`` per part; ``checked``
        holds those already found). So a part deleted before its append (a
        sweep, a crash between write and append, a client naming a key it
        never wrote) is refused with the append, never committed to fail
        every later read."""
        if not self.check_parts:
            return None
        if isinstance(command, CompareAndAppend):
            batches = command.batches
        elif isinstance(command, ApplyCompaction):
            batches = (command.output,)
        else:
            return None
        missing, reasons = [], []
        for part in (p for b in batches for p in b.parts if isinstance(p, BlobPart)):
            if part.key in checked:
                continue
            meta = self._blob.stat(part.key)
            if meta is None:
                missing.append(part.key)
                reasons.append(f"{part.key} is not in blob {self._blob.uri}")
            elif meta.size != part.encoded_bytes:
                missing.append(part.key)
                reasons.append(
                    f"{part.key} holds {meta.size} bytes, the part says {part.encoded_bytes}"
                )
            else:
                checked.add(part.key)
        if not missing:
            return None
        return PartsMissing(tuple(missing), "; ".join(reasons))

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"shard machine for {self.shard!r} is closed")

    def _commit(self, old: ShardState, made: Step) -> bool:
        data = encode_diff(made.diff)
        if not self._versions.compare_and_set(old.seqno, VersionedData(made.new.seqno, data)):
            return False
        self._state = made.new
        return True

    def _after_commit(self, state: ShardState) -> None:
        """Write a rollup once the latest is ``rollup_threshold`` versions old.

        The command already succeeded, so a failure here is only logged: the
        next commit by anyone tries again.
        """
        if state.seqno - state.latest_rollup().seqno < self.config.rollup_threshold:
            return
        key = rollup_key(self.shard, state.seqno)
        try:
            self._versions.put_rollup(key, state)
            self.run(AddRollup(state.seqno, key))
            if key not in self._state.referenced_keys():
                self._blob.delete(key)
        except (StorageError, Contended) as exc:
            log.warning("shard %r: rollup of version %d failed: %s", self.shard, state.seqno, exc)

    def _refresh_retrying(self) -> None:
        """:meth:`_refresh` through up to ``max_attempts`` storage errors
        (backing off between them); the last one is raised."""
        for attempt in range(self.config.max_attempts):
            try:
                self._refresh()
                return
            except StorageError:
                if attempt + 1 >= self.config.max_attempts:
                    raise
                backoff(attempt)

    def _refresh(self) -> None:
        """Bring the cached state up to (at least) the head."""
        self._state = self._versions.latest(self._state)
        self._suspect = False


def _check_schema(schema: bytes) -> None:
    try:
        parsed = schema_from_bytes(schema)
    except (pa.ArrowInvalid, OSError, TypeError) as exc:
        raise ValueError(f"shard schema is not a serialized Arrow schema: {exc}") from None
    full_schema(parsed)
