"""Several shards of one consensus store, opened together: a transaction
that appends one interval to each of them, all or nothing
(:mod:`.transactions`), and snapshots of all of them as of one time.

A :class:`ShardSet` comes from :func:`shardsink.open_shards`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import msgspec
import pyarrow as pa

from .._random_ids import random_hex
from .batches import flush_inline
from .commands import (
    AlreadyAppended,
    Appended,
    CompareAndAppend,
    InlineCapExceeded,
    WrongUpper,
)
from .errors import PersistError
from .shard import Shard
from .state import Batch, ShardState
from .transactions import Transactions
from .writer import Writer, count_appended


class TransactionMismatch(PersistError):
    """A transaction expected its shards' uppers ``expected``; ``actual``
    are their uppers (every shard's, by name). Nothing was appended."""

    def __init__(self, expected: Mapping[str, int], actual: Mapping[str, int]) -> None:
        differ = {s: (expected[s], actual[s]) for s in expected if expected[s] != actual[s]}
        named = ", ".join(f"{s} {e} (actual {a})" for s, (e, a) in differ.items())
        super().__init__(
            f"transaction upper mismatch: expected {named}; every shard's upper: "
            f"{dict(actual)}; nothing was appended"
        )
        self.expected, self.actual = dict(expected), dict(actual)


class TransactionRefused(PersistError):
    """A shard of the transaction refused it (``results`` by shard); nothing
    was appended."""

    def __init__(self, results: Mapping[str, object]) -> None:
        super().__init__(f"transaction refused, nothing appended: {dict(results)}")
        self.results = dict(results)


#: How often :func:`at_one_upper` reads the shards' states, and how long
#: it waits between two reads.
UPPER_READS, UPPER_WAIT_S = 50, 0.01


def at_one_upper(shards: Mapping[str, Shard]) -> dict[str, ShardState] | None:
    """The shards' latest states, read until every one has the same upper,
    :data:`UPPER_READS` times at most; ``None`` if they never did. Shards
    a transaction appends to move together, but a set of them is read one
    shard at a time: a transaction that commits between two reads shows
    them apart once."""
    for _ in range(UPPER_READS):
        states = {name: shard.state(refresh=True) for name, shard in shards.items()}
        if len({state.upper for state in states.values()}) == 1:
            return states
        time.sleep(UPPER_WAIT_S)
    return None


class ShardSet:
    """Shards of one consensus store (``shard(name)``) with one
    :class:`Transactions` runner; :meth:`close` (idempotent) closes them and
    what was opened for them."""

    def __init__(self, shards: Mapping[str, Shard], transactions: Transactions, owned: list):
        self.shards = dict(shards)
        self._transactions = transactions
        self._owned = owned
        self._writers: dict[str, Writer] = {}
        self._closed = False

    def shard(self, name: str) -> Shard:
        """The handle of shard ``name``; ``KeyError`` naming the shards there are."""
        try:
            return self.shards[name]
        except KeyError:
            raise KeyError(f"no shard {name!r} in this set; it has {sorted(self.shards)}") from None

    def writer(self, name: str) -> Writer:
        """This set's writer of shard ``name`` (registered on first use)."""
        if name not in self._writers:
            self._writers[name] = self.shard(name).writer(f"txn-{random_hex()[:12]}")
        return self._writers[name]

    def transaction(self) -> Transaction:
        return Transaction(self)

    def run(self, items: list[tuple[str, CompareAndAppend]]):
        return self._transactions.run_all(items)

    def uppers(self) -> dict[str, int]:
        return {name: shard.upper for name, shard in self.shards.items()}

    def common_upper(self) -> int:
        """The upper every shard has, as :func:`at_one_upper` reads them;
        ``ValueError`` naming each shard's if they keep differing (they were
        written apart, not by one writer's transactions)."""
        states = at_one_upper(self.shards)
        if states is None:
            raise ValueError(
                f"shards {', '.join(self.shards)} have different uppers ({self.uppers()}): "
                "they were not written together"
            )
        return next(iter(states.values())).upper

    def snapshots(self, as_of: int | None = None) -> dict[str, pa.Table]:
        """Every shard's consolidated collection as of one time ``as_of``
        (default: the last time every shard has sealed, the smallest upper
        - 1; ``NotReadable`` for a time a shard has not sealed)."""
        if as_of is None:
            as_of = max(min(self.uppers().values(), default=0) - 1, 0)
        return {name: shard.snapshot(as_of) for name, shard in self.shards.items()}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for writer in self._writers.values():
            writer.close()
        for shard in self.shards.values():
            shard.close()
        for resource in reversed(self._owned):
            resource.close()

    def __enter__(self) -> ShardSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transaction:
    """One interval appended to several shards of a :class:`ShardSet`, all
    or nothing: :meth:`append` writes each shard's batch (its parts, under
    the set's writer of that shard), or :meth:`add` takes batches written
    elsewhere; :meth:`commit` appends them all in one transaction. After an
    error whose outcome is unknown, calling :meth:`commit` again reuses the
    tokens: it commits exactly once."""

    def __init__(self, shards: ShardSet) -> None:
        self._set = shards
        self._items: dict[str, tuple[Writer, list[Batch], int, int]] = {}
        self._tokens: dict[str, str] = {}

    def append(self, shard: str, updates: pa.Table, expected_upper: int, new_upper: int) -> None:
        """Write ``updates`` (key, val, ts, diff) as shard ``shard``'s batch
        ``[expected_upper, new_upper)`` (an empty table: the interval is
        empty there); ``ValueError`` as ``Writer.batch`` raises it, or for a
        shard given twice."""
        if shard in self._items:
            raise ValueError(f"shard {shard!r} is in this transaction already")
        writer = self._set.writer(shard)
        batches = [] if updates.num_rows == 0 else [
            writer.batch(updates, expected_upper, new_upper)
        ]  # fmt: skip
        self.add(shard, batches, expected_upper, new_upper)

    def add(
        self,
        shard: str,
        batches: list[Batch],
        expected_upper: int,
        new_upper: int,
        *,
        writer: Writer | None = None,
    ) -> None:
        """Shard ``shard``'s ``batches`` of ``[expected_upper,
        new_upper)``, already written under ``writer``'s prefix (default:
        the set's writer of the shard), which the transaction appends them
        as: a cluster's workers write its writer's parts. ``ValueError``
        for a shard given twice, a batch of another interval, or a writer
        of another shard."""
        if shard in self._items:
            raise ValueError(f"shard {shard!r} is in this transaction already")
        writer = writer or self._set.writer(shard)
        if writer.shard is not self._set.shard(shard):
            raise ValueError(f"{writer!r} is not a writer of this set's shard {shard!r}")
        for batch in batches:
            if (batch.lower, batch.upper) != (expected_upper, new_upper):
                raise ValueError(
                    f"shard {shard!r}: batch {batch.id!r} covers [{batch.lower}, {batch.upper}), "
                    f"not [{expected_upper}, {new_upper})"
                )
        self._items[shard] = (writer, list(batches), expected_upper, new_upper)

    def commit(self) -> dict[str, int]:
        """Append every shard's batches or none; the new uppers. Errors:
        :class:`TransactionMismatch` (every shard's upper), :class:`TransactionRefused`,
        storage errors (outcome unknown: commit again). On the first two the
        batches' blobs are deleted (those no state references)."""
        items = []
        for name, (writer, batches, lower, upper) in self._items.items():
            token = self._tokens.setdefault(name, random_hex())
            command = CompareAndAppend(writer.writer_id, token, tuple(batches), lower, upper)
            items.append((name, command))
        results = self._set.run(items)
        if any(isinstance(r, InlineCapExceeded) for r in results):
            # a shard's inline budget is full: its batches' inline parts go
            # to blob, and the transaction is tried once more
            items = [self._to_blob(name, command) if isinstance(r, InlineCapExceeded)
                     else (name, command)
                     for (name, command), r in zip(items, results, strict=True)]  # fmt: skip
            results = self._set.run(items)
        if all(isinstance(r, Appended | AlreadyAppended) for r in results):
            for name, (_, batches, _, _) in self._items.items():
                count_appended(self._set.shard(name)._counters, batches)
            return {name: r.upper for (name, _), r in zip(items, results, strict=True)}
        self._discard()
        if all(isinstance(r, WrongUpper) for r in results):
            expected = {name: lower for name, (_, _, lower, _) in self._items.items()}
            actual = {name: r.actual for (name, _), r in zip(items, results, strict=True)}
            raise TransactionMismatch(expected, actual)
        raise TransactionRefused({name: r for (name, _), r in zip(items, results, strict=True)})

    def _to_blob(self, name: str, command: CompareAndAppend) -> tuple[str, CompareAndAppend]:
        shard = self._set.shard(name)
        flushed = tuple(
            flush_inline(shard.blob, name, command.writer_id, b, shard.schema, shard._counters)
            for b in command.batches
        )
        writer, _, lower, upper = self._items[name]
        self._items[name] = (writer, list(flushed), lower, upper)
        return name, msgspec.structs.replace(command, batches=flushed)

    def _discard(self) -> None:
        """Delete the batches' blobs: none of them was appended."""
        for writer, batches, _, _ in self._items.values():
            writer.discard(batches, tried=True)
