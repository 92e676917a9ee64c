"""The coordinator's writers of the workload's shards and its appends: one
compare-and-append with the shard's writer for a workload of one shard, one
transaction over every shard (:class:`~shardsink.persist.shards.Transaction`,
all or nothing) for a workload of several. The coordinator's loop around
them (retries through consensus restarts, minting, supervision) is
:mod:`.coordinator`'s.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import NamedTuple, TypeVar

from ..persist import (
    PartsMissing,
    PartsNotFound,
    PersistError,
    ShardSet,
    ShardStats,
    TransactionRefused,
    Writer,
    WriterExpired,
    WriterGone,
)
from ..protocol import Report
from ..storage import StorageError
from .accounting import Accepted, batches_of
from .records import Counters

log = logging.getLogger(__name__)
T = TypeVar("T")
#: ``call()`` through restarts of the consensus process, ``what`` naming it.
Through = Callable[[Callable[[], T], str], T]


class AppendCost(NamedTuple):
    """What one compare-and-append did, retries included: the parts it
    appended (inline parts the shard's inline cap sent to blob count as data
    parts, and their writes as blob puts) and its consensus work, summed
    over the shards; with several shards, ``parts_by_shard`` (data and
    inline) by name. A transaction's consensus work is the server's alone:
    its diff bytes and compare-and-sets are not counted here."""

    diff_bytes: int
    cas_calls: int
    blob_puts: int
    blob_put_bytes: int
    data_parts: int
    inline_parts: int
    inline_bytes: int
    parts_by_shard: dict[str, int]


def refusal(exc: TransactionRefused) -> Exception:
    """The error of a transaction a shard refused, as a single shard's
    append would raise it: :class:`WriterExpired` if a writer was gone,
    :class:`PartsNotFound` if parts were missing, else ``ValueError``."""
    for shard, result in exc.results.items():
        if isinstance(result, WriterGone):
            return WriterExpired(f"shard {shard!r}: writer {result.writer_id} expired; {exc}")
    for shard, result in exc.results.items():
        if isinstance(result, PartsMissing):
            return PartsNotFound(shard, result.keys, result.reason)
    return ValueError(str(exc))


def register(shards: ShardSet, name: str, through: Through) -> dict[str, Writer]:
    """A writer ``name`` of each of ``shards``, by shard name in their order,
    each registered through ``through``."""
    return {
        shard: through(
            lambda shard=shard: shards.shard(shard).writer(name),
            f"registering writer {name} of shard {shard}",
        )
        for shard in shards.shards
    }


class Appends:
    """The coordinator's ``writers`` of ``shards`` (by name, in the
    workload's order) and the appends it makes as them. ``through`` runs a
    consensus call through restarts of the consensus process; renewals are
    counted in ``counters``."""

    def __init__(
        self, shards: ShardSet, writers: dict[str, Writer], through: Through, counters: Counters
    ) -> None:
        self.shards = shards
        self.names = list(shards.shards)
        if list(writers) != self.names:
            raise ValueError(f"writers of {list(writers)}, not of the shards {self.names}")
        self.writers = dict(writers)
        self._through = through
        self._counters = counters

    def writer_ids(self) -> tuple[str, ...]:
        """The writers an attempt is minted as, by shard index."""
        return tuple(self.writers[shard].writer_id for shard in self.names)

    def heartbeat(self) -> None:
        """Heartbeat every writer, registering a new one in place of each
        that expired; a failure is logged (the next heartbeat tries again)."""
        for shard, writer in self.writers.items():
            try:
                writer.heartbeat()
            except WriterExpired as exc:
                self._renew(shard, str(exc))
            except (StorageError, PersistError) as exc:
                log.warning("could not heartbeat the writer of shard %r: %s", shard, exc)

    def renew_expired(self) -> None:
        """Register a new writer in place of each that expired, asking each
        through consensus restarts."""
        for shard, writer in self.writers.items():
            try:
                self._through(writer.heartbeat, f"heartbeating {writer!r}")
            except WriterExpired as exc:
                self._renew(shard, str(exc))

    def _renew(self, shard: str, why: str) -> None:
        """A new writer of ``shard`` in place of the expired one; attempts
        minted as the old one are refused at their append."""
        old = self.writers[shard]
        self.writers[shard] = self._through(
            lambda: self.shards.shard(shard).writer(old.name), "registering a writer"
        )
        new = self.writers[shard].writer_id
        log.warning("%s; writing as %s from the next attempt on", why, new)
        self._counters.writers_renewed += 1
        assert old.writer_id != new

    def discard(self, reports: Iterable[Report], why: str, *, tried: bool = False) -> None:
        """Delete the blobs of the batches of ``reports`` that will never be
        appended, each shard's by its writer (``tried``: as
        :meth:`~shardsink.persist.writer.Writer.discard`)."""
        by_shard: dict[int, list[Report]] = {}
        for report in reports:
            by_shard.setdefault(report.shard, []).append(report)
        for shard, of_shard in by_shard.items():
            batches = batches_of(of_shard)
            if shard < len(self.names) and any(b.blob_keys() for b in batches):
                writer = self.writers[self.names[shard]]
                log.info("deleting the blobs of %s", why)
                self._through(
                    lambda writer=writer, batches=batches: writer.discard(batches, tried=tried),
                    f"deleting the blobs of {why}",
                )

    def one_try(self, accepted: list[Accepted], lower: int, upper: int) -> Callable[[], object]:
        """One try of the append of ``accepted`` (each shard's, in order) as
        ``[lower, upper)``: every call the same tokens, so a retry after an
        unknown outcome appends exactly once. A refused transaction raises
        as :func:`refusal` says."""
        if len(self.names) == 1:
            writer, token = self.writers[self.names[0]], uuid.uuid4().hex
            batches = list(accepted[0].batches)
            return lambda: writer.compare_and_append(batches, lower, upper, token=token)
        transaction = self.shards.transaction()
        for name, of_shard in zip(self.names, accepted, strict=True):
            transaction.add(name, list(of_shard.batches), lower, upper, writer=self.writers[name])

        def commit() -> None:
            try:
                transaction.commit()
            except TransactionRefused as exc:
                raise refusal(exc) from exc

        return commit

    def stats(self) -> dict[str, ShardStats]:
        """Every shard handle's counters, by name (for :meth:`cost`)."""
        return {name: self.shards.shard(name).stats() for name in self.names}

    def cost(self, before: dict[str, ShardStats]) -> AppendCost:
        """What was appended since the shards' :meth:`stats` were ``before``."""
        fields = AppendCost._fields[:-1]
        after = self.stats()
        work = {n: {f: getattr(after[n], f) - getattr(then, f) for f in fields}
                for n, then in before.items()}  # fmt: skip
        return AppendCost(
            *(sum(w[f] for w in work.values()) for f in fields),
            parts_by_shard={n: w["data_parts"] + w["inline_parts"] for n, w in work.items()}
            if len(work) > 1
            else {},
        )

    def upper(self) -> int:
        """The shards' upper, which they share
        (:meth:`~shardsink.persist.shards.ShardSet.common_upper`:
        ``ValueError`` naming each if they differ)."""
        return self._through(self.shards.common_upper, "reading the upper")

    def close(self) -> None:
        """Expire every writer (a failure is logged)."""
        for writer in self.writers.values():
            try:
                writer.close()
            except (StorageError, PersistError) as exc:
                log.warning("could not expire %r: %s", writer, exc)
