"""The spine: which batches automatic compaction merges, as a pure policy.

A batch's **level** is ``rows.bit_length()`` (0 for no rows, ``k`` for
``2**(k-1) <= rows < 2**k``). The rule, over batches in time order:

    an older batch and the batch right after it merge whenever the older
    one's level is not above the newer one's.

:func:`merges` picks such pairs left to right, each batch in at most one
pair, so one round's merges are disjoint and can run together. Every merge
removes a batch, so rounds end; when none is left, levels strictly decrease
in time order, hence the batches number at most ``L + 1`` for the largest
level ``L``: :func:`batch_bound` of the state's rows, O(log n) of the
updates (merges only ever lower the rows, by consolidation). Appends add a
newer batch at the end, so a steady stream of equal appends behaves as a
binary counter: a merge of two equal levels makes one of the next level up.

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


def merges(state: ShardState) -> list[tuple[Batch, Batch]]:
    """The disjoint adjacent pairs ``(older, newer)`` to merge now, left to
    right; empty when the state is within the rule."""
    order = state.ordered_batches()
    pairs: list[tuple[Batch, Batch]] = []
    i = 0
    while i + 1 < len(order):
        if level(order[i]) <= level(order[i + 1]):
            pairs.append((order[i], order[i + 1]))
            i += 2
        else:
            i += 1
    return pairs


def batch_bound(state: ShardState) -> int:
    """How many batches the state has at most once :func:`merges` is empty:
    one per level up to that of all its rows together."""
    return sum(b.rows for b in state.batches.values()).bit_length() + 1
