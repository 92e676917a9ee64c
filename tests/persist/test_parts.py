"""Part encodings and consolidation."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pytest
import zstandard

from shardsink.persist import parts as P
from shardsink.persist.batches import load_part
from shardsink.persist.errors import CorruptState
from shardsink.persist.state import Part
from shardsink.storage.memory import MemoryBlob
from tests.helpers.persist import SCHEMA, interval_rows, rows_of, updates


def test_consolidate_sums_drops_zeros_and_sorts():
    table = updates(
        [(2, "b", 1, 1), (1, "a", 1, 1), (2, "b", 1, -1), (1, "a", 1, 2), (1, "a", 0, 1)]
    )
    assert rows_of(P.consolidate(table)) == [(1, "a", 0, 1), (1, "a", 1, 3)]


def test_at_time_filters_and_advances_ts():
    table = updates([(1, "a", 0, 1), (1, "a", 3, -1), (2, "b", 3, 1), (3, "c", 9, 1)])
    assert rows_of(P.at_time(table, 2)) == [(1, "a", 2, 1)]
    assert rows_of(P.at_time(table, 5)) == [(2, "b", 5, 1)]


def test_forward_moves_times_below_since():
    table = updates([(1, "a", 0, 1), (1, "a", 7, 1)])
    assert P.forward(table, 5)["ts"].to_pylist() == [5, 7]


def test_inline_round_trip_and_size_limit():
    table = updates([(k, "v", 3, 1) for k in range(5)])
    part = P.inline_part(table, 4096)
    assert part.rows == 5 and (part.ts_lo, part.ts_hi, part.key_lo, part.key_hi) == (3, 3, 0, 4)
    assert P.decode_inline(part, SCHEMA).equals(table)
    assert P.inline_part(table, len(part.data)) is None


def test_an_inline_part_sorts_its_rows_unless_the_caller_says_they_are():
    """Unordered rows are sorted; ``ordered=True`` (a consolidated table's
    word) is trusted, so a broken promise is kept as it was given (readers
    sort an inline part whose rows are out of order: ``windows.part_chunks``)."""
    table = updates([(2, "b", 3, 1), (1, "a", 3, 1)])
    assert P.decode_inline(P.inline_part(table, 4096), SCHEMA)["key"].to_pylist() == [1, 2]
    trusted = P.inline_part(table, 4096, ordered=True)
    assert P.decode_inline(trusted, SCHEMA)["key"].to_pylist() == [2, 1]


@pytest.mark.parametrize("pad", [0, 100], ids=["small", "large"])
@pytest.mark.parametrize(
    ("rows", "kept"),
    [
        ([(1, "a", 3, 1), (1, "b", 3, -1), (2, "a", 3, 2)], True),  # consolidated already
        ([(1, "a", 3, 1), (1, "a", 4, 1), (1, "b", 0, 1)], True),  # by val and by ts
        ([(2, "a", 3, 1), (1, "a", 3, 1)], False),  # out of order
        ([(1, "b", 3, 1), (1, "a", 3, 1)], False),  # out of order in val
        ([(1, "a", 3, 1), (1, "a", 3, 1)], False),  # alike: summed
        ([(1, "a", 3, 1), (2, "b", 3, 0)], False),  # a zero diff: dropped
        ([(1, "a", 3, 1), (1, "a", 3, -1), (2, "b", 3, 1)], False),  # summed to zero
    ],
)
def test_a_table_consolidated_already_is_kept_as_it_is(rows, kept, pad):
    """A table whose rows are consolidated already is kept as it is (looked
    at in Python when small, by Arrow's comparisons when large); what comes
    out is what Arrow's grouping and sort give."""
    table = updates([(k - pad, "p", 3, 1) for k in range(pad)] + rows)
    assert (pad > P.SMALL_ROWS) == (table.num_rows > P.SMALL_ROWS)
    quick = P.consolidate(table)
    assert (quick is table) == kept
    assert rows_of(quick) == rows_of(P._grouped(table))


def test_a_large_table_with_a_null_or_a_nan_key_sorts_them_last():
    """A NaN sorts after every number and a null after every value, so a
    table ending in one is consolidated already; one that starts with it,
    or holds two of them, is grouped (two nulls, two NaNs are one value)."""
    table = updates([(k, "v", 3, 1) for k in range(100)])
    nan, keys = float("nan"), list(map(float, range(99)))
    cases = {
        "nan last": ([*keys, nan], pa.float64(), True),
        "null last": ([*range(99), None], pa.int64(), True),
        "nan first": ([nan, *keys], pa.float64(), False),
        "two nulls": ([*range(98), None, None], pa.int64(), False),
        "two nans": ([*keys[:98], nan, nan], pa.float64(), False),
    }
    for name, (values, kind, already) in cases.items():
        case = table.set_column(0, "key", pa.array(values, kind))
        assert P._consolidated_already(case) is already, name
        out = P.consolidate(case)
        assert (out is case) is already, name
        assert P.in_update_order(out, strict=True), name
    null_val = table.set_column(1, "val", pa.array(["v"] * 99 + [None], pa.string()))
    assert P.consolidate(null_val) is null_val
    assert rows_of(P._grouped(null_val)) == rows_of(null_val)


def test_only_types_python_orders_as_arrow_are_looked_at_in_python():
    """Floats (NaN, -0.0) and nulls are not Python's to order: Arrow's way
    (:mod:`~shardsink.persist.values`) decides, and orders them last."""
    ts, diff = pa.array([3, 3], pa.uint64()), pa.array([1, 1], pa.int64())
    floats = pa.table({"key": [1.0, float("nan")], "val": ["a", "a"], "ts": ts, "diff": diff})
    assert P._consolidated_already(floats)
    assert not P._consolidated_already(floats.take([1, 0]))
    zeros = pa.table({"key": [-0.0, 0.0], "val": ["a", "a"], "ts": ts, "diff": diff})
    assert not P._consolidated_already(zeros)
    assert P.consolidate(zeros)["diff"].to_pylist() == [2]
    nulls = updates([(1, "a", 3, 1), (2, "b", 3, 1)]).set_column(
        1, "val", pa.array(["a", None], pa.string())
    )
    assert P._consolidated_already(nulls)


def test_a_small_parts_bounds_in_python_are_arrows():
    ts = pa.array([5, 3, 9, 1], pa.uint64())
    for keys in ([3, -1, 7, 2], ["b", "a", "é", "z"]):
        table = pa.table({"key": keys, "ts": ts})
        assert P._small_bounds(table) == P._arrow_bounds(table)
    for keys in ([1.0, 2.0, float("nan"), 0.5], ["a", None, "b", "c"]):  # Arrow's way then
        assert P._small_bounds(pa.table({"key": keys, "ts": ts})) is None


def _message(table: pa.Table) -> bytes:
    return table.combine_chunks().to_batches()[0].serialize().to_pybytes()


def test_an_inline_part_is_its_message_compressed_whole_with_little_around_it():
    """A 4x8 trickle's 4-row part: no schema in it, the message's metadata
    compressed with its body, and only the part's own fields around it."""
    table = interval_rows(3, range(100, 132, 8))
    message = _message(table)
    part = P.inline_part(table, 4096)
    assert (part.codec, part.size) == ("zstd", len(message))
    assert len(part.data) < len(message) // 2
    assert pa.decompress(part.data, part.size, codec="zstd").to_pybytes() == message
    assert SCHEMA.serialize().to_pybytes() not in message
    assert len(msgspec.msgpack.encode(part)) - len(part.data) < 80
    assert P.decode_inline(part, SCHEMA).equals(table)


def test_an_inline_part_stored_uncompressed_by_an_earlier_version_still_reads():
    table = interval_rows(3, range(4))
    earlier = msgspec.msgpack.encode(
        {"type": "inline", "data": _message(table), "rows": 4, "ts_lo": 3, "ts_hi": 3,
         "key_lo": 0, "key_hi": 3}
    )  # fmt: skip
    part = msgspec.msgpack.decode(earlier, type=Part)
    assert (part.codec, part.size) == ("none", 0)
    assert P.decode_inline(part, SCHEMA).equals(table)


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda p: msgspec.structs.replace(p, data=p.data[:-4]), "corrupt payload"),
        (
            lambda p: msgspec.structs.replace(p, data=p.data[:20] + bytes(8) + p.data[28:]),
            "corrupt",
        ),
        (lambda p: msgspec.structs.replace(p, size=p.size + 1), "corrupt payload"),
        (lambda p: msgspec.structs.replace(p, size=1 << 40), "decompressed size"),
        (
            # a frame that says it holds 64 MiB is refused before it is decompressed
            lambda p: msgspec.structs.replace(p, data=zstandard.compress(bytes(64 << 20))),
            "its zstd frame holds 67108864 bytes",
        ),
        (lambda p: msgspec.structs.replace(p, rows=p.rows + 1), "holds 4 rows"),
        (lambda p: msgspec.structs.replace(p, codec="none"), "corrupt payload"),
    ],
    ids=[
        "truncated",
        "overwritten",
        "wrong-size",
        "huge-size",
        "bomb",
        "wrong-rows",
        "wrong-codec",
    ],
)
def test_a_corrupt_inline_part_is_an_error_naming_the_shard_and_the_part(damage, says):
    part = damage(P.inline_part(interval_rows(3, range(4)), 4096))
    with pytest.raises(ValueError, match=says):
        P.decode_inline(part, SCHEMA)
    with pytest.raises(CorruptState) as error:
        load_part(MemoryBlob(), "s", part, SCHEMA)
    assert str(error.value).startswith(f"shard 's': {P.describe(part)}: ")
    assert P.describe(part).startswith(f"inline part ({part.codec}, {part.rows} rows, ts 3..3, ")


def test_parquet_round_trip_is_plain_parquet():
    table = updates([(k, format(k, "032x"), 1, 1) for k in range(100)])
    part, data = P.blob_part(table, "s/part/x.parquet")
    assert part.encoded_bytes == len(data) and part.rows == 100
    assert P.decode_parquet(data, SCHEMA).equals(table)
    with pytest.raises(ValueError, match="corrupt Parquet"):
        P.decode_parquet(b"nope", SCHEMA)
    other = pa.schema([("key", pa.string()), ("val", pa.string())])
    with pytest.raises(ValueError, match="schema"):
        P.decode_parquet(data, P.full_schema(other))


def test_full_schema():
    assert P.full_schema().names == ["key", "val", "ts", "diff"]
    custom = pa.schema([("key", pa.string()), ("val", pa.float64())])
    assert P.full_schema(custom).field("ts").type == pa.uint64()
    with pytest.raises(ValueError, match="fields key, val"):
        P.full_schema(pa.schema([("k", pa.int64())]))
    with pytest.raises(ValueError, match=r"pyarrow\.Schema"):
        P.full_schema("key int64")


def test_conform_names_the_bad_column():
    with pytest.raises(ValueError, match="lack column 'diff'"):
        P.conform(pa.table({"key": [1], "val": ["a"], "ts": [1]}), SCHEMA)
    with pytest.raises(ValueError, match="column 'key'"):
        P.conform(pa.table({"key": ["x"], "val": ["a"], "ts": [1], "diff": [1]}), SCHEMA)
    loose = pa.table({"diff": [1], "ts": [1], "val": ["a"], "key": [1]})
    assert P.conform(loose, SCHEMA).schema == SCHEMA


def test_split_near_target():
    table = updates([(k, "v" * 100, 1, 1) for k in range(1000)])
    pieces = P.split(table, table.nbytes // 4)
    assert 4 <= len(pieces) <= 5 and sum(p.num_rows for p in pieces) == 1000
    assert P.split(updates([]), 10) == []
