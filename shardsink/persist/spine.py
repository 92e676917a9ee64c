"""The spine: which batches automatic compaction merges, as a pure policy.

A batch's **level** is ``rows.bit_length()`` (0 for no rows, ``k`` for
``2**(k-1) <= rows < 2**k``). The rule, over batches in time order:

    an older batch and the batch right after it merge whenever the older
    one's level is not above the newer one's.

Merging removes a batch, so merging by the rule ends; when it does, levels
strictly decrease in time order, hence the batches number at most ``L + 1``
for the largest level ``L``: :func:`batch_bound` of the state's rows, O(log
n) of the updates (merges only ever lower the rows, by consolidation).
Appends add a newer batch at the end, so a steady stream of equal appends
behaves as a binary counter: a merge of two equal levels makes one of the
next level up, and each update is rewritten once per level it climbs.

:func:`merges` makes one pass to the rule's fixed point, on row counts
alone, and merges everything from the oldest batch it changes through the
newest into one batch: a contiguous run, one compaction, one
compare-and-append and (beyond the inline limit) one blob part, however many
small batches arrived since the last pass. (Pairwise merges cost one
compare-and-append per batch removed and fell behind appends that add
several batches each; one output per group of the fixed point wrote a part
per bit of a binary counter.) The batches the pass takes beyond the rule's
own groups are newer, hence smaller, than the ones it merges anyway, so each
update is still rewritten about once per level it climbs.

Merging at every look would write a blob part for every few small appends;
:func:`pass_due` waits until a pass removes ``slack`` batches at least, so a
pass writes about one part per ``slack`` batches appended while the state
holds at most ``slack`` batches more than the rule's fixed point (plus what
arrives during a pass).

A pass that takes in a large old batch takes a while; the batches appended
meanwhile need not wait for it: :func:`merges` with a ``wall`` leaves out
the batches a running pass merges and everything older, so another pass can
keep the newer batches within the rule beside it. :func:`next_pass` runs
passes in *lanes* of growing caps (the consensus server's: 4 MiB, 64 MiB and
no cap), one pass per lane at a time: the rule's run goes to the smallest
free lane whose cap it fits, so a long merge of old batches never holds up
the small ones, and the rule's carries among the batches appended during it
go to a middle lane instead of piling up. When no free lane fits the run,
the largest free one merges the newest batches up to its cap (:func:`tail`)
instead: the rule merges their output later like any other batch. (Two
lanes, a 4 MiB one and an uncapped one, left the 4 MiB outputs of a minute's
appends piling up beside a long merge: 59 batches in a 20,000-interval soak.)

A merge writes its output as any batch is written: parts below the shard's
``inline_max_bytes`` inline, larger ones to blob. So merging moves inline
updates to blob once they outgrow that limit, and a converged spine of
single-part batches holds fewer than ``batch_bound * inline_max_bytes``
inline bytes: the inline budget recovers.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from .state import Batch, ShardState


def level(batch: Batch) -> int:
    """The batch's level: ``rows.bit_length()``."""
    return batch.rows.bit_length()


def merges(state: ShardState, wall: Collection[str] = ()) -> list[list[Batch]]:
    """The run of adjacent batches (oldest first) that one pass merges into
    one batch, as a list of at most one run; empty when the state is within
    the rule. Only batches newer than every batch of ``wall`` (ids, say of
    batches a pass is merging already) take part.

    The run starts at the oldest batch the rule would merge (applied to its
    fixed point, counting a merge's rows as its inputs' sum) and ends at the
    newest batch; like the rule, it takes in older batches while their level
    is not above the run's. So after the pass, levels strictly decrease
    again, and a pass writes one batch, not one per group the rule would
    form (a binary counter of the small batches since the last pass)."""
    # A stack of (rows, run) whose levels strictly decrease from bottom to
    # top between pushes: only a pushed run can break the rule, against the
    # run below it, and each merge may break it again one further down.
    stack: list[tuple[int, list[Batch]]] = []
    for batch in _beyond(state.ordered_batches(), wall):
        _push(stack, batch.rows, [batch])
    first = next((i for i, (_, run) in enumerate(stack) if len(run) > 1), None)
    if first is None:
        return []
    tail = stack[first:]
    del stack[first:]
    _push(stack, sum(rows for rows, _ in tail), [b for _, run in tail for b in run])
    return [stack[-1][1]]


def _beyond(order: list[Batch], wall: Collection[str]) -> list[Batch]:
    """The batches of ``order`` after the last one whose id is in ``wall``."""
    last = max((i for i, batch in enumerate(order) if batch.id in wall), default=-1)
    return order[last + 1 :]


def _push(stack: list[tuple[int, list[Batch]]], rows: int, run: list[Batch]) -> None:
    """Push ``run`` of ``rows`` rows, merging it with the runs below it while
    their level is not above its own."""
    while stack and stack[-1][0].bit_length() <= rows.bit_length():
        below_rows, below = stack.pop()
        rows, run = below_rows + rows, below + run
    stack.append((rows, run))


def tail(state: ShardState, wall: Collection[str], max_bytes: int) -> list[list[Batch]]:
    """The newest batches beyond ``wall`` together at most ``max_bytes``
    (encoded) as one run, if there are two or more; else empty."""
    run: list[Batch] = []
    size = 0
    for batch in reversed(_beyond(state.ordered_batches(), wall)):
        size += batch.encoded_bytes
        if size > max_bytes:
            break
        run.insert(0, batch)
    return [run] if len(run) > 1 else []


def next_pass(
    state: ShardState,
    running: Mapping[int, Collection[str]],
    slack: int,
    caps: Sequence[int | None],
) -> tuple[int, list[list[Batch]]] | None:
    """The lane and runs of the pass to start now, or ``None``: every lane
    busy, or no pass removes ``slack`` batches beyond the running ones.
    ``caps``: the most encoded bytes a pass in each lane (by index) merges,
    ascending, ``None`` for no cap; ``running``: the ids each busy lane is
    merging."""
    free = [lane for lane in range(len(caps)) if lane not in running]
    if not free:
        return None
    wall = {batch_id for ids in running.values() for batch_id in ids}
    runs = merges(state, wall)
    size = sum(b.encoded_bytes for run in runs for b in run)
    fits = [lane for lane in free if caps[lane] is None or size <= caps[lane]]
    if fits:
        lane = fits[0]
    else:
        lane = free[-1]
        runs = tail(state, wall, caps[lane])
    if not pass_due(runs, slack):
        return None
    return lane, runs


def removed(runs: list[list[Batch]]) -> int:
    """How many batches merging ``runs`` removes: each run becomes one."""
    return sum(len(run) - 1 for run in runs)


def pass_due(runs: list[list[Batch]], slack: int) -> bool:
    """Whether a pass merging ``runs`` (:func:`merges`) removes at least
    ``slack`` batches (any, for ``slack <= 1``)."""
    return removed(runs) >= max(1, slack)


def batch_bound(state: ShardState) -> int:
    """How many batches the state has at most once :func:`merges` is empty:
    one per level up to that of all its rows together."""
    return sum(b.rows for b in state.batches.values()).bit_length() + 1
