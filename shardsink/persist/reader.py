"""A shard's leased reader: snapshots, streamed reads and listening.

A :class:`Reader` comes from :meth:`~.shard.Shard.reader`. Every read first
moves its lease to the newest version, then selects what to read from exactly
that version, so garbage collection keeps every blob it selected.

A process that owns the shard's blobs alone (it holds the data dir's lock:
nothing else collects garbage or compacts while it reads) reads without a
lease (``leased=False``): registering, leasing and expiring a reader are
three versions of the state, which a read-only command (``shard verify``,
``read``, ``export``, ``manifest``) must not write.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from .. import faults
from .._extras import require
from . import parts as P
from .batches import load_part
from .commands import (
    ExpireReader,
    HeartbeatReader,
    Leased,
    LeaseSeqno,
    ReaderExpired,
    RegisterReader,
    Result,
)
from .errors import NotReadable, PartMissing
from .manifest import manifest
from .state import Batch, BlobPart, ShardState
from .windows import CHUNK_ROWS, WINDOW_ROWS, Missing, output_columns, part_chunks, windows

if TYPE_CHECKING:
    from .shard import Shard

#: How many times a read restarts from refreshed state after a part went missing.
PART_RETRIES = 2

#: Rows per record batch of a streamed read.
BATCH_ROWS = 64 * 1024


class ListenEvent(NamedTuple):
    """Updates with ``lower <= ts < upper``, consolidated, sorted by key."""

    lower: int
    upper: int
    updates: pa.Table


class Reader:
    """A leased reader. Every read first moves the lease to the newest version
    and then selects batches from exactly that version, so GC keeps every
    blob it selects. ``close()`` releases the lease (idempotent). Not
    ``leased`` (see the module doc): every read selects from the newest
    version, and nothing is registered, heartbeated or expired."""

    def __init__(
        self, shard: Shard, reader_id: str, lease_ms: int | None, *, leased: bool = True
    ) -> None:
        self.shard = shard
        self.reader_id = reader_id
        self.leased = leased
        self.lease_ms = shard.config.reader_lease_ms if lease_ms is None else lease_ms
        if self.lease_ms < 1:
            raise ValueError(f"reader lease must be >= 1 ms, got {self.lease_ms}")
        self._closed = False
        self._register()

    def _register(self) -> ShardState:
        if not self.leased:
            return self.shard.machine.state(refresh=True)
        result = self.shard.machine.run(RegisterReader(self.reader_id, self.lease_ms))
        return _leased(self.shard, result)

    def lease(self) -> ShardState:
        """Heartbeat and move this reader's hold to the newest version; return
        that version. An expired reader registers again: safe, because what it
        reads is selected after the lease."""
        self._check_open()
        if not self.leased:
            return self._register()
        result = self.shard.machine.run(LeaseSeqno(self.reader_id))
        return (
            self._register() if isinstance(result, ReaderExpired) else _leased(self.shard, result)
        )

    def heartbeat(self) -> None:
        """Renew the lease without moving the hold."""
        self._check_open()
        if not self.leased:
            return
        if isinstance(self.shard.machine.run(HeartbeatReader(self.reader_id)), ReaderExpired):
            self._register()

    def snapshot(self, as_of: int | None = None, *, wait: float = 0.0) -> pa.Table:
        """The consolidated collection as of ``as_of``, all of it in memory:
        :meth:`batches` read to the end."""
        return self.batches(as_of, wait=wait).read_all()

    def batches(
        self,
        as_of: int | None = None,
        columns: Sequence[str] | None = None,
        *,
        wait: float = 0.0,
        max_rows: int = BATCH_ROWS,
        window_rows: int = WINDOW_ROWS,
    ) -> pa.RecordBatchReader:
        """Stream the consolidated collection as of ``as_of`` (default: upper -
        1): ``columns`` (default key, val, ts, diff) of every ``(key, val)``
        whose diffs at ``ts <= as_of`` do not sum to zero, with ts = ``as_of``
        and diff = the sum, sorted by key then val, in record batches of at
        most ``max_rows`` rows. Empty if nothing was ever written and
        ``as_of`` is ``None``.

        Memory is bounded by the parts overlapping one key range
        (:func:`~.windows.windows`; a window takes at most ``window_rows`` rows
        of each part it spans), not by the shard. The stream holds its own
        lease (heartbeated while it is read), taken before it selects parts
        and released when it is exhausted, or dropped, or its shard closed; a part gone missing
        mid-stream (an expired lease) resumes after the last key sent from
        refreshed state.

        Errors, raised here: ``ValueError`` for an unknown column;
        :class:`NotReadable` if ``as_of`` is below ``since``, or not below the
        upper after waiting up to ``wait`` seconds. While reading:
        :class:`PartMissing` if a part stays missing through ``PART_RETRIES``
        refreshes, :class:`NotReadable` if ``since`` passed ``as_of`` meanwhile."""
        return self._batches(as_of, columns, wait, max_rows, window_rows=window_rows, release=False)

    def _batches(
        self,
        as_of: int | None,
        columns: Sequence[str] | None,
        wait: float,
        max_rows: int,
        *,
        window_rows: int,
        release: bool,
    ) -> pa.RecordBatchReader:
        """:meth:`batches`; with ``release`` the stream closes this reader
        when it is exhausted or dropped (and an error raised here closes it)."""
        try:
            self._check_open()
            names = output_columns(self.shard.schema, columns)
            for name, rows in (("max_rows", max_rows), ("window_rows", window_rows)):
                if rows < 1:
                    raise ValueError(f"{name} must be >= 1, got {rows}")
            state, as_of = self._readable(as_of, wait)
        except BaseException:
            if release:
                self.close()
            raise
        schema = pa.schema([self.shard.schema.field(n) for n in names])
        if as_of is None:
            if release:
                self.close()
            return pa.RecordBatchReader.from_batches(schema, iter(()))
        batches = self._stream(state, as_of, names, max_rows, window_rows, release)
        if release:
            # a stream dropped before its first batch never runs its generator's finally
            weakref.finalize(batches, self.close)
        return pa.RecordBatchReader.from_batches(schema, batches)

    def to_duckdb(self, connection=None, as_of: int | None = None, columns=None):
        """The snapshot as a DuckDB relation on ``connection`` (default: a new
        in-memory one) that scans :meth:`batches` as DuckDB reads it (needs
        the ``read`` extra: :class:`~shardsink._extras.MissingExtra` without it)."""
        require("Reader.to_duckdb", "read", "duckdb")
        import duckdb

        connection = connection or duckdb.connect()
        return connection.from_arrow(self.batches(as_of, columns))

    def to_polars(self, as_of: int | None = None, columns=None):
        """The snapshot as a Polars DataFrame built from :meth:`batches`'
        Arrow buffers (needs the ``read`` extra: :class:`~shardsink._extras.MissingExtra`
        without it)."""
        require("Reader.to_polars", "read", "polars")
        import polars

        return polars.from_arrow(self.batches(as_of, columns).read_all())

    def manifest(self, as_of: int | None = None) -> dict:
        """The live parts and inline updates a snapshot as of ``as_of`` reads,
        from the version this reader leases (see :func:`~.manifest.manifest`);
        :class:`NotReadable` as for :meth:`batches`."""
        self._check_open()
        state, as_of = self._readable(as_of, 0.0)
        return manifest(state, as_of, self.shard.schema)

    def _readable(self, as_of: int | None, wait: float) -> tuple[ShardState, int | None]:
        """Lease, then the leased state and the as-of to read (``None``: the
        shard was never written and none was asked); :class:`NotReadable` as
        for :meth:`batches`."""
        state = self.lease()
        if as_of is None:
            if state.upper == 0:
                return state, None
            as_of = state.upper - 1
        if as_of >= state.upper:
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    self.shard.machine.wait_for_upper_past(as_of, wait)
                state = self.lease()
            if as_of >= state.upper:
                raise NotReadable(
                    f"shard {self.shard.name!r}: as_of {as_of} is not below the upper "
                    f"{state.upper} (not yet written)"
                )
        self._check_since(state, as_of)
        return state, as_of

    def _check_since(self, state: ShardState, as_of: int) -> None:
        if as_of < state.since:
            raise NotReadable(
                f"shard {self.shard.name!r}: as_of {as_of} is below the since "
                f"{state.since} (merged forward)"
            )

    def _stream(
        self,
        state: ShardState,
        as_of: int,
        names: list[str],
        max_rows: int,
        window_rows: int,
        release: bool,
    ) -> Iterator[pa.RecordBatch]:
        """The record batches of :meth:`batches`; with ``release``, closes
        this reader when exhausted, closed or failed."""
        shard = self.shard
        after = None
        beat = time.monotonic()
        try:
            for attempt in range(PART_RETRIES + 1):
                if attempt:
                    shard._counters.part_refetches += 1
                    state = self.lease()
                    self._check_since(state, as_of)
                faults.point("reader.before_fetch")
                parts = [p for b in state.ordered_batches() if b.lower <= as_of for p in b.parts]
                load = functools.partial(
                    part_chunks,
                    shard.blob,
                    shard.name,
                    schema=shard.schema,
                    rows=CHUNK_ROWS,
                )
                try:
                    for table, cut in windows(parts, load, as_of, shard.schema, after, window_rows):
                        after = cut
                        if time.monotonic() - beat > self.lease_ms / 3000.0:
                            self.heartbeat()
                            beat = time.monotonic()
                        yield from table.select(names).to_batches(max_chunksize=max_rows)
                    return
                except Missing as missing:
                    key = missing.key
            raise PartMissing(shard.name, key, PART_RETRIES + 1)
        finally:
            if release:
                self.close()

    def listen(
        self,
        since: int | None = None,
        *,
        until: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[ListenEvent]:
        """Each appended interval from ``since`` on (default: the current
        upper), in order, as :class:`ListenEvent` s that tile the times
        (intervals merged by compaction come as one event). Stops once an
        event reaches ``until``; waits for new appends otherwise,
        heartbeating, and raises ``TimeoutError`` after ``timeout`` seconds
        without one.

        Errors: :class:`NotReadable` if the frontier is at or below a
        non-zero ``since`` (times there may have been merged forward);
        :class:`PartMissing` as for :meth:`snapshot`."""
        schema = self.shard.schema
        frontier = self.shard.upper if since is None else since
        while until is None or frontier < until:
            state = self.lease()
            if state.upper <= frontier:
                self._wait_past(frontier, timeout)
                continue

            def select(state: ShardState, frontier: int = frontier) -> list[Batch]:
                if state.since > 0 and frontier <= state.since:
                    raise NotReadable(
                        f"shard {self.shard.name!r}: listen frontier {frontier} is not above "
                        f"the since {state.since} (merged forward)"
                    )
                return [b for b in state.ordered_batches() if b.upper > frontier]

            state, tables = self._read(state, select)
            data = P.in_times(P.concat(tables, schema), frontier, state.upper)
            cuts = {frontier, state.upper}
            for batch in state.ordered_batches():
                cuts.update(t for t in (batch.lower, batch.upper) if frontier < t < state.upper)
            bounds = sorted(cuts)
            for lower, upper in itertools.pairwise(bounds):
                yield ListenEvent(lower, upper, P.consolidate(P.in_times(data, lower, upper)))
            frontier = state.upper

    def _wait_past(self, frontier: int, timeout: float | None) -> None:
        """Wait for the upper to pass ``frontier``, heartbeating every third of
        the lease; ``TimeoutError`` after ``timeout`` seconds."""
        chunk = self.lease_ms / 3000.0
        remaining = timeout
        while True:
            step = chunk if remaining is None else min(chunk, remaining)
            try:
                self.shard.machine.wait_for_upper_past(frontier, step)
                return
            except TimeoutError:
                if remaining is not None:
                    remaining -= step
                    if remaining <= 0:
                        raise TimeoutError(
                            f"shard {self.shard.name!r}: upper did not pass {frontier} "
                            f"within {timeout} s"
                        ) from None
                self.heartbeat()

    def _read(
        self, state: ShardState, select: Callable[[ShardState], list[Batch]]
    ) -> tuple[ShardState, list[pa.Table]]:
        """Fetch the parts of the batches ``select`` picks from the leased
        ``state``; if a part's blob is missing, lease again and re-select, at
        most ``PART_RETRIES`` times, then raise :class:`PartMissing`."""
        shard = self.shard
        cache: dict[str, pa.Table] = {}
        for attempt in range(PART_RETRIES + 1):
            if attempt:
                shard._counters.part_refetches += 1
                state = self.lease()
            selected = select(state)
            faults.point("reader.before_fetch")
            fetched = self._fetch(selected, cache)
            if not isinstance(fetched, str):
                return state, fetched
        raise PartMissing(shard.name, fetched, PART_RETRIES + 1)

    def _fetch(self, batches: list[Batch], cache: dict[str, pa.Table]) -> list[pa.Table] | str:
        """The tables of ``batches``' parts, or the key of a missing one.
        ``cache`` keeps blob parts across attempts (blob keys are immutable)."""
        shard = self.shard
        tables = []
        for part in (p for b in batches for p in b.parts):
            table = cache.get(part.key) if isinstance(part, BlobPart) else None
            if table is None:
                table = load_part(shard.blob, shard.name, part, shard.schema)
                if table is None:
                    return part.key
                if isinstance(part, BlobPart):
                    cache[part.key] = table
            tables.append(table)
        return tables

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"reader {self.reader_id!r} of shard {self.shard.name!r} is closed")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.leased:
                self.shard.machine.run(ExpireReader(self.reader_id))

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Reader({self.reader_id!r} on {self.shard.name!r})"


def _leased(shard: Shard, result: Result) -> ShardState:
    if isinstance(result, Leased):
        return result.state
    raise ValueError(f"shard {shard.name!r}: reader lease answered {result!r}")
