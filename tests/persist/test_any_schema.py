"""Any schema, end to end: generated nested key and value types and
updates appended to a shard; its snapshot (before and after compaction, in
Arrow and blob parts alike), its digests and verify agree with a model of
plain Python values (:mod:`tests.helpers.values`)."""

from __future__ import annotations

import collections

import pyarrow as pa
from hypothesis import HealthCheck, given, settings, strategies as st

from shardsink.persist import digest as D
from shardsink.persist.config import ShardConfig
from shardsink.persist.shard import Shard
from tests.helpers.persist import memory_stores
from tests.helpers.values import canon, types, values

INTERVAL = 10


@st.composite
def histories(draw):
    """A key type, a value type, a few keys and values of each, and a few
    intervals of updates over them (inserts and retractions), so that equal
    values meet within an interval and across them."""
    key_type, val_type = draw(types), draw(types)
    keys = draw(st.lists(values(key_type), min_size=1, max_size=3))
    vals = draw(st.lists(values(val_type), min_size=1, max_size=3))
    row = st.tuples(
        st.integers(0, len(keys) - 1), st.integers(0, len(vals) - 1), st.integers(-2, 2)
    )
    intervals = draw(st.lists(st.lists(row, max_size=6), min_size=1, max_size=4))
    return key_type, val_type, keys, vals, intervals


def model_of(key_type, val_type, rows) -> dict:
    """The collection the ``(key, val, diff)`` rows sum to, by the model."""
    sums: collections.Counter = collections.Counter()
    for key, val, diff in rows:
        sums[(canon(key, key_type), canon(val, val_type))] += diff
    return {kv: d for kv, d in sums.items() if d}


def collection_of(table: pa.Table) -> dict:
    kinds = table.schema.field("key").type, table.schema.field("val").type
    got = model_of(*kinds, zip(table["key"].to_pylist(), table["val"].to_pylist(),
                               table["diff"].to_pylist(), strict=True))  # fmt: skip
    assert len(got) == table.num_rows, "a snapshot holds each (key, val) once, no zero diff"
    return got


def assert_sorted(table: pa.Table) -> None:
    kinds = table.schema.field("key").type, table.schema.field("val").type
    order = [
        (canon(k, kinds[0]), canon(v, kinds[1]))
        for k, v in zip(table["key"].to_pylist(), table["val"].to_pylist(), strict=True)
    ]
    assert order == sorted(order)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.sampled_from([0, 4096]))
def test_snapshot_compaction_digest_and_verify_agree_with_the_model(history, inline_max):
    """``inline_max`` 0 writes every part to blob (Parquet), 4096 inlines
    them (Arrow IPC in state)."""
    key_type, val_type, keys, vals, intervals = history
    schema = pa.schema([("key", key_type), ("val", val_type)])
    blob, consensus = memory_stores()
    config = ShardConfig(inline_max_bytes=inline_max)
    with Shard.open("s", blob=blob, consensus=consensus, schema=schema, config=config) as shard:
        writer = shard.writer()
        written: list[tuple] = []
        for i, rows in enumerate(intervals):
            items = [(keys[k], vals[v], d) for k, v, d in rows]
            written += items
            table = pa.table(
                {
                    "key": pa.array([k for k, _, _ in items], key_type),
                    "val": pa.array([v for _, v, _ in items], val_type),
                    "ts": pa.array([i * INTERVAL] * len(items), pa.uint64()),
                    "diff": pa.array([d for _, _, d in items], pa.int64()),
                }
            )
            writer.compare_and_append_table(table, i * INTERVAL, (i + 1) * INTERVAL)
        expected = model_of(key_type, val_type, written)
        as_of = len(intervals) * INTERVAL - 1
        before = shard.snapshot(as_of)
        assert collection_of(before) == expected
        assert_sorted(before)
        merged = len(shard.state(refresh=True).batches)
        assert shard.compact().applied == (1 if merged >= 2 else 0)
        after = shard.snapshot(as_of)
        assert collection_of(after) == expected
        assert_sorted(after)
        state = shard.state(refresh=True)
        written_digest = D.total_known(b.digest for b in state.batches.values())
        assert written_digest is not None and D.digest(after).same_content(written_digest)
        report = shard.verify()
        assert report.verified, report.problems
