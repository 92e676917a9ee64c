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

:func:`merges` applies the rule to a fixed point in one pass, on row counts
alone, and returns each group of batches that ends up as one batch: a
contiguous run, merged by one compaction into one batch. So however many
small batches arrived since the last pass, one compare-and-append replaces
them (pairwise merges cost one per batch removed, and fell behind appends
that add several batches each).

A merge writes its output as any batch is written: parts below the shard's
``inline_max_bytes`` inline, larger ones to blob. So merging moves inline
updates to blob once they outgrow that limit, and a converged spine of
single-part batches holds fewer than ``batch_bound * inline_max_bytes``
inline bytes: the inline budget recovers.
"""

from __future__ import annotations

from .state import Batch, ShardState


def level(batch: Batch) -> int:
    """The batch's level: ``rows.bit_length()``."""
    return batch.rows.bit_length()


def merges(state: ShardState) -> list[list[Batch]]:
    """The runs of adjacent batches (oldest first) that the rule merges into
    one batch each, counting a merge's rows as its inputs' sum; only runs of
    two or more. Empty when the state is within the rule."""
    # A stack of (rows, run) whose levels strictly decrease from bottom to
    # top between pushes: only a pushed run can break the rule, against the
    # run below it, and each merge may break it again one further down.
    stack: list[tuple[int, list[Batch]]] = []
    for batch in state.ordered_batches():
        rows, run = batch.rows, [batch]
        while stack and stack[-1][0].bit_length() <= rows.bit_length():
            below_rows, below = stack.pop()
            rows, run = below_rows + rows, below + run
        stack.append((rows, run))
    return [run for _, run in stack if len(run) > 1]


def batch_bound(state: ShardState) -> int:
    """How many batches the state has at most once :func:`merges` is empty:
    one per level up to that of all its rows together."""
    return sum(b.rows for b in state.batches.values()).bit_length() + 1
