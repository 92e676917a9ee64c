"""A shard's writer: builds batches and compare-and-appends them.

A :class:`Writer` comes from :meth:`~.shard.Shard.writer`; it registers with
the shard, which gives it its id, and appends under an idempotency token, so
a retried append whose outcome was unknown happens exactly once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgspec
import pyarrow as pa

from .._random_ids import random_hex
from ..storage import StorageError
from . import parts as P
from .batches import build_batch, check_interval, check_ts, delete_unreferenced, flush_inline
from .commands import (
    AlreadyAppended,
    Appended,
    CompareAndAppend,
    ExpireWriter,
    HeartbeatWriter,
    InlineCapExceeded,
    PartsMissing,
    Rejected,
    Result,
    WriterGone,
    WrongUpper,
)
from .errors import PartsNotFound, PersistError, UpperMismatch, WriterExpired
from .maintenance import register_writer
from .state import Batch, InlinePart
from .stats import ShardStats

if TYPE_CHECKING:
    from .shard import Shard

log = logging.getLogger(__name__)


class Writer:
    """Builds batches and compare-and-appends them, as the writer registered
    under ``name``; ``writer_id`` is the id the shard gave it (its parts'
    keys carry it). Once expired (its lease ran out) it stays expired: its
    calls raise :class:`~.errors.WriterExpired`, and a new writer takes
    over. ``close()`` forgets the writer in state (idempotent)."""

    def __init__(self, shard: Shard, name: str) -> None:
        self.shard = shard
        self.name = name
        self._pending: tuple[str, tuple[str, ...], int, int] | None = None
        self._closed = False
        self.writer_id = register_writer(shard.machine, name)

    def heartbeat(self) -> None:
        """Tell the shard this writer is alive, so it is not expired;
        :class:`~.errors.WriterExpired` if it already was."""
        result = self.shard.machine.run(HeartbeatWriter(self.writer_id))
        if isinstance(result, WriterGone):
            raise self._expired()

    def batch(self, updates: pa.Table, lower: int, upper: int) -> Batch:
        """Write ``updates`` (columns key, val, ts, diff) as a batch ``[lower,
        upper)``: consolidated, split into parts near the blob target size,
        small parts inline. ``ValueError`` if ``lower < upper`` does not hold,
        a column is missing or does not cast, or a row's ts is outside
        ``[lower, upper)``."""
        check_interval(lower, upper)
        shard = self.shard
        table = P.conform(updates, shard.schema)
        check_ts(table, shard.name, lower, upper)
        return build_batch(
            shard.blob,
            shard.name,
            P.consolidate(table),
            lower,
            upper,
            writer=self.writer_id,
            inline_max_bytes=shard.machine.state().inline_max_bytes,
            target_bytes=shard.config.blob_target_bytes,
            stats=shard._counters,
        )

    def compare_and_append(
        self,
        batches: list[Batch],
        expected_upper: int,
        new_upper: int,
        *,
        token: str | None = None,
    ) -> int:
        """Append ``batches`` (each ``[expected_upper, new_upper)``; none for an
        empty interval) iff the shard's upper is ``expected_upper``; return the
        new upper.

        The call carries an idempotency ``token`` (fresh by default). If it
        raises (a storage error, :class:`~.errors.Contended`), the outcome may
        be unknown: calling again with the same batches and uppers reuses the
        token, so it succeeds exactly once and never appends twice.

        Errors: :class:`UpperMismatch` (with the actual upper); ``ValueError``
        for batches that do not match the interval; storage errors.
        """
        batches = list(batches)
        for batch in batches:
            if (batch.lower, batch.upper) != (expected_upper, new_upper):
                raise ValueError(
                    f"batch {batch.id!r} covers [{batch.lower}, {batch.upper}), not the "
                    f"appended interval [{expected_upper}, {new_upper})"
                )
        signature = (tuple(b.id for b in batches), expected_upper, new_upper)
        if token is None:
            token = self._pending[0] if self._pending and self._pending[1:] == signature else None
            token = token or random_hex()
        shard = self.shard
        shard._counters.append_calls += 1
        command = CompareAndAppend(self.writer_id, token, tuple(batches), expected_upper, new_upper)
        try:
            result = shard.machine.run(command)
            if isinstance(result, InlineCapExceeded):
                flushed = tuple(
                    flush_inline(
                        shard.blob, shard.name, self.writer_id, b, shard.schema, shard._counters
                    )
                    for b in batches
                )
                result = shard.machine.run(msgspec.structs.replace(command, batches=flushed))
                batches = list(flushed)
        except Exception:
            # the outcome may be unknown: a retry of this same call reuses the token
            self._pending = (token, *signature)
            raise
        self._pending = None
        return self._outcome(result, batches, expected_upper)

    def _outcome(self, result: Result, batches: list[Batch], expected_upper: int) -> int:
        shard = self.shard
        if isinstance(result, Appended | AlreadyAppended):
            count_appended(shard._counters, batches)
            return result.upper
        if isinstance(result, WrongUpper):
            raise UpperMismatch(shard.name, expected_upper, result.actual)
        if isinstance(result, WriterGone):
            raise self._expired()
        if isinstance(result, PartsMissing):
            raise PartsNotFound(shard.name, result.keys, result.reason)
        if isinstance(result, Rejected):
            raise ValueError(f"shard {shard.name!r}: compare_and_append rejected: {result.reason}")
        raise ValueError(f"shard {shard.name!r}: compare_and_append answered {result!r}")

    def compare_and_append_table(
        self, updates: pa.Table, expected_upper: int, new_upper: int
    ) -> int:
        """Build one batch of ``updates`` and compare-and-append it; on
        :class:`UpperMismatch` its blobs are deleted before the error is raised.

        Each call builds a new batch, hence a new token: to retry an append
        whose outcome is unknown exactly once, use :meth:`batch` and retry
        :meth:`compare_and_append` with the same batch."""
        batch = self.batch(updates, expected_upper, new_upper)
        try:
            return self.compare_and_append([batch], expected_upper, new_upper)
        except (UpperMismatch, WriterExpired, PartsNotFound):
            self.discard([batch], tried=True)
            raise

    def discard(self, batches: list[Batch], *, tried: bool = False) -> None:
        """Delete the blobs of ``batches``, which were never appended; with
        ``tried`` (an append of them was tried, and a try whose answer was
        lost may have committed them), only those the shard's current state
        does not reference (its state unreadable: none, the sweep takes them
        once this writer is gone). Best effort, as
        :func:`~.batches.delete_unreferenced`."""
        keys = [k for b in batches for k in b.blob_keys()]
        if tried and keys:
            try:
                referenced = self.shard.state(refresh=True).referenced_keys()
            except (StorageError, PersistError) as exc:
                log.warning("%r: leaving %d blobs to the sweep: %s", self.shard, len(keys), exc)
                return
            keys = [k for k in keys if k not in referenced]
        delete_unreferenced(self.shard.blob, keys)

    def _expired(self) -> WriterExpired:
        return WriterExpired(
            f"shard {self.shard.name!r}: writer {self.writer_id} expired (not seen for its "
            "lease); nothing was appended: write the batch again with a new writer"
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.shard.machine.run(ExpireWriter(self.writer_id))

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Writer({self.writer_id!r} on {self.shard.name!r})"


def count_appended(counters: ShardStats, batches: list[Batch]) -> None:
    """Count an append of ``batches`` in a shard handle's ``counters``: one
    append, its rows, its inline and data parts."""
    counters.appends += 1
    for batch in batches:
        counters.rows += batch.rows
        for part in batch.parts:
            if isinstance(part, InlinePart):
                counters.inline_parts += 1
                counters.inline_bytes += len(part.data)
            else:
                counters.data_parts += 1
