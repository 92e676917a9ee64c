"""One interval, many shards, all or nothing: a compare-and-append across
shards of one consensus store.

A transaction is a list of ``(shard, CompareAndAppend)``, one per shard,
each with its own writer, token, batches and uppers. It commits every
append or none: each shard's command is applied to its state (the pure
transition, :mod:`.transitions`), and the new versions of all of them are
stored with one :meth:`~shardsink.storage.contracts.Consensus.compare_and_set_all`,
the store's own multi-key transaction.

Why not Materialize's txn-wal (a ``txns`` shard as a write-ahead log that
each data shard's upper is then advanced from, lazily): every shard of a
shardsink consensus store already changes only through compare-and-set on
one store that has transactions (SQLite's, PostgreSQL's), and a consensus
server serializes them all, so the store can commit the shards' versions
together directly. A reader of one shard then sees a state that is either
before the transaction or after it, whichever shard it reads, with no
extra shard to consult and no lag: the price is that a transaction's
shards live in one consensus store (txn-wal lets them span stores through
its log). What it costs is measured by ``bench appends --txn``.

:func:`decide` is the rule, pure: whether the per-shard answers let the
transaction commit, and if not, what each shard answers. The rule keeps
atomicity through retries after an indeterminate error: a retry with the
same tokens finds every shard ``AlreadyAppended`` (it committed) or none
(it did not), never some.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from .. import faults
from ..storage import CasRequest, Committed, Consensus
from .commands import (
    AlreadyAppended,
    CompareAndAppend,
    Rejected,
    Result,
    WrongUpper,
)
from .errors import Contended
from .machine import LocalMachine, Prepared

#: One shard's part of a transaction.
Item = tuple[str, CompareAndAppend]


@runtime_checkable
class Transactions(Protocol):
    """Runs transactions across shards (see the module doc).

    ``run_all(items)`` applies every item's compare-and-append or none,
    durably and linearizably, and returns each item's result, in order:

    - all :class:`~.commands.Appended` (it committed), or all
      :class:`~.commands.AlreadyAppended` (a retry, same tokens, of one
      that committed);
    - or, when it did not commit, a refusal for every item: all
      :class:`~.commands.WrongUpper` when any shard's upper was not its
      ``expected_upper`` (each carries its own shard's actual upper), else
      the refusing shards' own answers (``WriterGone``, ``PartsMissing``,
      ``Rejected``, ``InlineCapExceeded``) and ``Rejected`` naming them
      for the others.

    Shards must be distinct (``ValueError``). Storage failures that outlast
    the retries are raised; after an ``IndeterminateError`` the transaction
    committed whole or not at all, and a retry with the same commands says
    which."""

    def run_all(self, items: Sequence[Item]) -> list[Result]: ...


def decide(items: Sequence[Item], answers: Sequence[Result | None], uppers: Sequence[int]):
    """The rule (pure): ``answers[i]`` is what item ``i``'s transition gave
    without a version to store (``None``: it would commit), ``uppers[i]``
    its shard's upper. ``None`` when the transaction commits; else every
    item's result (see :class:`Transactions`)."""
    if all(a is None for a in answers):
        return None
    if any(isinstance(a, WrongUpper) for a in answers):
        return [
            WrongUpper(command.expected_upper, upper)
            for (_, command), upper in zip(items, uppers, strict=True)
        ]
    if all(isinstance(a, AlreadyAppended) for a in answers):
        return list(answers)
    refused = [
        f"{shard}: {type(a).__name__}"
        for (shard, _), a in zip(items, answers, strict=True)
        if a is not None and not isinstance(a, AlreadyAppended)
    ]
    if not refused:  # some applied, some not: never from this module's commits
        done = [shard for (shard, _), a in zip(items, answers, strict=True) if a is not None]
        why = f"the transaction was already applied to {', '.join(done)} only"
        return [Rejected(why) for _ in items]
    why = f"another shard of the transaction refused it ({'; '.join(refused)})"
    return [a if a is not None and not isinstance(a, AlreadyAppended) else Rejected(why)
            for a in answers]  # fmt: skip


class LocalTransactions:
    """:class:`Transactions` over this process's machines of shards of one
    consensus ``store`` (``machines`` by shard name). Each shard's machine
    is locked while its version is prepared and stored, in shard order (so
    two transactions never deadlock); a store that did not commit (another
    writer moved a head) re-reads the heads and tries again, up to
    ``max_attempts`` (then :class:`~.errors.Contended`)."""

    def __init__(
        self, machines: Mapping[str, LocalMachine], store: Consensus, max_attempts: int = 8
    ) -> None:
        self._machines = machines
        self._store = store
        self._max_attempts = max_attempts

    def run_all(self, items: Sequence[Item]) -> list[Result]:
        shards = [shard for shard, _ in items]
        if len(set(shards)) != len(shards):
            raise ValueError(f"a transaction names each shard once, not {shards}")
        unknown = [s for s in shards if s not in self._machines]
        if unknown:
            raise ValueError(f"shards {unknown} are not this transaction runner's")
        order = sorted(range(len(items)), key=lambda i: shards[i])
        for attempt in range(self._max_attempts):
            results = self._attempt(items, order)
            if results is not None:
                return results
            time.sleep(min(0.001 * 2**attempt, 0.1))
        raise Contended(
            f"a transaction of shards {', '.join(shards)} lost {self._max_attempts} "
            "compare-and-sets in a row"
        )

    def _attempt(self, items: Sequence[Item], order: list[int]) -> list[Result] | None:
        """One try: the results, or ``None`` if the store did not commit.
        Every shard's machine is locked, in shard order, for the whole try."""
        prepared: dict[int, Prepared] = {}
        answers: list[Result | None] = [None] * len(items)
        with contextlib.ExitStack() as held:
            try:
                for i in order:
                    shard, command = items[i]
                    step = held.enter_context(self._machines[shard].preparing(command, fresh=True))
                    if isinstance(step, Prepared):
                        prepared[i] = step
                    else:
                        answers[i] = step
                uppers = [
                    (prepared[i].old if i in prepared else self._machines[s].state()).upper
                    for i, (s, _) in enumerate(items)
                ]
                decided = decide(items, answers, uppers)
                if decided is not None:
                    self._abandon(prepared, tried=False)
                    return decided
                requests = [CasRequest(items[i][0], prepared[i].old.seqno, prepared[i].version)
                            for i in range(len(items))]  # fmt: skip
                faults.point("transaction.before_store")
                outcomes = self._store.compare_and_set_all(requests)
            except BaseException:
                self._abandon(prepared, tried=True)
                raise
            if not all(isinstance(o, Committed) for o in outcomes):
                self._abandon(prepared, tried=True)
                return None
            out: list[Result] = []
            for i, outcome in enumerate(outcomes):
                result, _ = self._machines[items[i][0]].finish(prepared[i], outcome)
                out.append(result)
            return out

    def _abandon(self, prepared: dict[int, Prepared], *, tried: bool) -> None:
        for step in prepared.values():
            self._machines[step.new.shard].abandon(step, tried=tried)
