"""The chaos readers' checks: of a workload without an expected collection,
snapshots at batch ends compared with the digests of the batches up to them;
of several shards, one as-of for all and their uppers read around each
other."""

from __future__ import annotations

import random

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from shardsink import open_shard
from shardsink.chaos.clients import batch_ends, digest_difference, pick_as_of, torn
from shardsink.persist.state import ShardState
from shardsink.workloads import shard_schema, updates
from shardsink.workloads.synth import Synth
from tests.helpers.persist import memory_stores

T = 1000


def _shard_of_synth(intervals: int):
    """A memory shard holding ``intervals`` synth intervals (updates and
    deletes, a string key and a struct value), one batch each."""
    workload = Synth(rows_per_interval=60, update=0.3, delete=0.1, key="string",
                     columns={"name": "string", "n": "int32"})  # fmt: skip
    schema = shard_schema(workload, "synth")
    blob, consensus = memory_stores()
    shard = open_shard("s", blob=blob, consensus=consensus, schema=schema)
    writer = shard.writer()
    for i in range(intervals):
        table = updates(workload, schema, i, 0, 1, i * T)
        writer.compare_and_append_table(table, i * T, (i + 1) * T)
    return shard


def test_a_snapshot_at_a_batch_end_agrees_with_the_digests_up_to_it() -> None:
    with _shard_of_synth(5) as shard:
        state = shard.state()
        assert batch_ends(state, 2 * T, 5 * T) == {3 * T - 1, 4 * T - 1, 5 * T - 1}
        assert batch_ends(state, 2 * T, 4 * T - 1) == {3 * T - 1}
        ends = {pick_as_of({"s": state}, False, random.Random(seed)) for seed in range(40)}
        assert ends == {T - 1, 2 * T - 1, 3 * T - 1, 4 * T - 1, 5 * T - 1}
        for as_of in (T - 1, 3 * T - 1, 5 * T - 1):
            assert digest_difference(shard.reader().snapshot(as_of), state, as_of) is None


def test_a_changed_value_or_a_missing_batch_is_named() -> None:
    with _shard_of_synth(4) as shard:
        state = shard.state()
        table = shard.reader().snapshot(4 * T - 1).combine_chunks()
        names = pc.struct_field(table["val"], "name")
        changed = pc.if_else(pa.array([i == 7 for i in range(len(table))]), "changed", names)
        fields = [changed.chunk(0), pc.struct_field(table["val"], "n").chunk(0)]
        val = pa.StructArray.from_arrays(fields, fields=list(table.schema.field("val").type))
        wrong = digest_difference(table.set_column(1, "val", val), state, 4 * T - 1)
        assert wrong and "the batches up to it were written with" in wrong
        short = shard.reader().snapshot(3 * T - 1)
        assert "it reads" in digest_difference(short, state, 4 * T - 1)


def test_a_batch_of_unknown_digest_says_nothing() -> None:
    with _shard_of_synth(2) as shard:
        state = shard.state()
        first = state.ordered_batches()[0]
        unknown = msgspec.structs.replace(first, digest=None)
        state = msgspec.structs.replace(state, batches={**state.batches, first.id: unknown})
        assert digest_difference(shard.reader().snapshot(2 * T - 1), state, 2 * T - 1) == ""


def _state(upper: int, since: int = 0) -> ShardState:
    return ShardState(
        shard="s", seqno=1, schema=b"", inline_max_bytes=0, inline_total_max_bytes=0,
        upper=upper, since=since,
    )  # fmt: skip


def test_uppers_read_around_each_other_agree_unless_torn() -> None:
    states = {"a": _state(3 * T), "b": _state(4 * T), "c": _state(3 * T)}
    assert torn("a", 3 * T, 4 * T, states) is None  # b read after a transaction, before a again
    seen = torn("a", 3 * T, 3 * T, states)  # a did not move, yet b holds an interval more
    assert seen and "were at b 4000: an interval in some shards" in seen


def test_one_as_of_for_every_shard_is_below_every_upper() -> None:
    states = {"a": _state(5 * T, since=T), "b": _state(4 * T, since=2 * T)}
    picked = {pick_as_of(states, True, random.Random(seed)) for seed in range(200)}
    assert min(picked) >= 2 * T and max(picked) < 4 * T
    assert pick_as_of({"a": _state(2 * T, since=2 * T)}, True, random.Random(0)) is None
