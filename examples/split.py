"""A measuring workload (docs/workloads.md, Several shards): trickle's rows
spread over several shards by key, so a run of it writes exactly the rows a
run of ``trickle`` writes to one shard, every interval as one transaction
over all of them. Side by side with trickle it shows what several shards
cost against the same rows in one.

    shardsink up --workload examples/split.py:Split --rows-per-interval 1000
    shardsink up --workload trickle --rows-per-interval 1000

Key ``k`` goes to shard ``s{k % shards}``; each shard's expected collection
is trickle's, split the same way.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from shardsink.workloads import Workload


class Split:
    """``rows_per_interval`` trickle rows an interval over ``shards`` shards
    (``s0``, ``s1``, ...)."""

    def __init__(self, rows_per_interval: int = 1000, shards: int = 2) -> None:
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self.trickle = Workload("trickle", rows_per_interval)
        self.shards = {f"s{i}": self.trickle.schema for i in range(shards)}

    def updates(self, interval: int, worker: int, workers: int) -> dict[str, pa.Table]:
        return self._split(self.trickle.updates(interval, worker, workers))

    def expected(self, intervals: int) -> dict[str, pa.Table]:
        return self._split(self.trickle.expected(intervals))

    def _split(self, table: pa.Table) -> dict[str, pa.Table]:
        shard = pc.remainder(table["key"], len(self.shards))
        return {name: table.filter(pc.equal(shard, i)) for i, name in enumerate(self.shards)}
