"""A group's builder with a workload of several shards: each shard's parts
coalesce into that shard's batches apart, and every answer names its shard."""

from __future__ import annotations

import uuid

import msgspec
import pyarrow as pa
import pytest

from shardsink import protocol
from shardsink.builder.group import GroupBuilder
from shardsink.builder.shards import ShardBuilders
from shardsink.persist.parts import full_schema
from shardsink.shm import Received
from shardsink.storage.memory import MemoryBlob
from tests.helpers.cluster import WRITER, rows_batch

#: Shard 1's rows: a string key and an int32 value.
OTHER = full_schema(pa.schema([("key", pa.string()), ("val", pa.int32())]))


def _other(keys: list[str]) -> pa.RecordBatch:
    rows = [{"key": k, "val": len(k), "ts": 0, "diff": 1} for k in keys]
    return pa.RecordBatch.from_pylist(rows, schema=OTHER)


def _part(worker: int, shard: int, batch: pa.RecordBatch, *, last: bool) -> Received:
    meta = protocol.Contribute(
        0, 0, 0, 1000, barrier=1, worker=worker, rows=batch.num_rows, last=int(last),
        writer=WRITER, shard=shard,
    )  # fmt: skip
    return Received(
        protocol.worker_identity(worker), 0, batch, protocol.contribute_meta(meta), None
    )


def _builders(acked: list) -> ShardBuilders:
    blob = MemoryBlob(uuid.uuid4().hex)

    def ack(*parts: Received) -> None:
        acked.extend(parts)

    def builder(index: int, name: str, schema: pa.Schema) -> GroupBuilder:
        return GroupBuilder(
            0, 2, blob, name, inline_max_bytes=4096, target_bytes=1 << 30, ack=ack,
            shard_index=index, schema=schema,
        )  # fmt: skip

    shards = [builder(0, "orders", rows_batch([], 0).schema), builder(1, "lines", OTHER)]
    return ShardBuilders(shards, ack)


def test_each_shards_parts_coalesce_into_its_own_batch():
    """Barrier, 2 workers, 2 shards: each shard's last finisher gets a batch
    of that shard's rows alone, its parts under that shard's name."""
    group = _builders([])
    finishes = [
        group.take(_part(0, 0, rows_batch([0, 2], 0), last=True)),
        group.take(_part(0, 1, _other(["a"]), last=True)),
        group.take(_part(1, 1, _other(["bb", "cc"]), last=True)),
        group.take(_part(1, 0, rows_batch([1], 0), last=True)),
    ]
    assert finishes == [(0, (0, 0), 0), (1, (0, 0), 0), (1, (0, 0), 1), (0, (0, 0), 1)]
    answers = [group.finish(f, 0.0) for f in finishes]
    assert [(a.shard, a.shared is not None) for a in answers] == [
        (0, False), (1, False), (1, True), (0, True)
    ]  # fmt: skip
    lines, orders = answers[2].shared, answers[3].shared
    assert (orders.batch.rows, orders.contributors) == (3, {0: 2, 1: 1})
    assert (lines.batch.rows, lines.contributors) == (3, {0: 1, 1: 2})
    assert lines.batch.digest != orders.batch.digest


def test_a_part_of_a_shard_the_workload_has_not_or_of_another_schema_is_refused():
    acked: list = []
    group = _builders(acked)
    stray = _part(0, 2, rows_batch([5], 0), last=True)
    with pytest.raises(msgspec.ValidationError, match="shard 2, of a workload of 2 shards"):
        group.take(stray)
    assert acked == [stray]  # released all the same
    crossed = _part(1, 1, rows_batch([7], 0), last=True)  # shard 0's rows sent as shard 1's
    assert group.take(crossed) == (1, (0, 0), 1)
    answer = group.finish((1, (0, 0), 1), 0.0)
    assert answer.shard == 1 and answer.shared is None
    assert answer.error == "a part of worker 1 is not of shard lines's schema"
    assert acked == [stray, crossed]
