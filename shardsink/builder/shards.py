"""The shared batches of every shard of a group: one
:class:`~shardsink.builder.group.GroupBuilder` per shard of the workload,
driven by one stream of parts.

A workload of several shards has each worker send the parts of every shard
on its one channel, each part's metadata naming its shard
(:class:`~shardsink.protocol.Contribute`). :class:`ShardBuilders` hands each
part to its shard's builder, so each shard's rows coalesce apart (one batch
per shard per group, or per host, and interval) while the decisions of
each (who is last, lingers, abandons) are exactly those of a group of one
shard. A workload of one shard runs the same way, with one builder.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec

from .. import protocol
from ..shm import Received
from .group import GroupBuilder
from .host_link import HostLink
from .shared_batch import BatchId

log = logging.getLogger(__name__)

#: A finish to decide: (shard index, batch id, worker).
Finish = tuple[int, BatchId, int]


class ShardBuilders:
    """The :class:`GroupBuilder` of each shard (``builders[i]``: shard
    ``i``'s, its ``shard_index`` ``i``), behind the interface the builder's
    loop drives (each method as :class:`GroupBuilder`'s, over every shard).
    ``ack`` releases parts that reach no shard's builder."""

    def __init__(self, builders: Sequence[GroupBuilder], ack) -> None:
        if [b.shard_index for b in builders] != list(range(len(builders))):
            raise ValueError("the builders must be shard 0, 1, ... in order")
        self.builders = list(builders)
        self.label = builders[0].label
        self.upstream: HostLink | None = builders[0].upstream
        self._ack = ack

    def take(self, part: Received) -> Finish | None:
        """Take one part into its shard's builder; the finish to decide, if it
        is one. ``msgspec.ValidationError`` (the part released) for metadata
        that is no contribution, or names a shard the workload has not."""
        try:
            c = protocol.decode_contribute(part.meta)
            if c.shard >= len(self.builders):
                raise msgspec.ValidationError(
                    f"shard {c.shard}, of a workload of {len(self.builders)} shards"
                )
        except msgspec.ValidationError:
            self._ack(part)
            raise
        finish = self.builders[c.shard].take(part, c)
        return None if finish is None else (c.shard, *finish)

    def finish(self, finish: Finish, now: float) -> protocol.Handoff | None:
        shard, bid, worker = finish
        return self.builders[shard].finish(bid, worker, now)

    def expire(self, now: float) -> None:
        for builder in self.builders:
            builder.expire(now)

    def next_deadline(self) -> float | None:
        deadlines = [d for b in self.builders if (d := b.next_deadline()) is not None]
        return min(deadlines, default=None)

    def resolved(self) -> list[tuple[int, protocol.Handoff]]:
        return [answer for builder in self.builders for answer in builder.resolved()]

    def relay(self, answer: protocol.Handoff) -> list[tuple[int, protocol.Handoff]]:
        """The host builder's ``answer``, relayed by its shard's builder; an
        answer of a shard the workload has not is logged and dropped."""
        if answer.shard >= len(self.builders):
            log.warning("%s: the host builder answered for shard %d", self.label, answer.shard)
            return []
        return self.builders[answer.shard].relay(answer)

    def abandon(self, bid: BatchId) -> None:
        for builder in self.builders:
            builder.abandon(bid)

    def close(self) -> None:
        for builder in self.builders:
            builder.close()
