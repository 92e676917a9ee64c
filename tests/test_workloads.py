"""The workloads of docs/architecture.md section 9, checked against a literal reading of it."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from shardsink.workloads import SCHEMA, Workload, values


def spec_updates(name: str, r: int, s: int, t: int, interval: int) -> Counter:
    """The spec, row by row: (key, val, ts) -> diff."""
    out: Counter = Counter()
    if name == "hydrate":
        ins = range(s) if interval == 0 else range(s + (interval - 1) * r, s + interval * r)
    else:
        ins = range(interval * r, (interval + 1) * r)
    for k in ins:
        out[(k, format(k, "032x"), interval * t)] += 1
    if name == "churn" and interval >= 2:
        for k in range((interval - 2) * r, (interval - 1) * r):
            out[(k, format(k, "032x"), interval * t)] -= 1
    return out


def as_counter(table: pa.Table) -> Counter:
    c: Counter = Counter()
    for row in table.to_pylist():
        c[(row["key"], row["val"], row["ts"])] += row["diff"]
    return c


@pytest.mark.parametrize("name", ["trickle", "churn", "hydrate"])
@pytest.mark.parametrize("n_workers", [1, 3, 8])
def test_workers_partition_each_interval_exactly(name: str, n_workers: int) -> None:
    w = Workload(name, rows_per_interval=10, snapshot_rows=25, interval_ms=7)
    for interval in range(5):
        merged: Counter = Counter()
        for worker in range(n_workers):
            part = w.updates(interval, worker, n_workers)
            assert part.schema == SCHEMA
            assert all(k % n_workers == worker for k in part.column("key").to_pylist())
            merged.update(as_counter(part))
        assert merged == spec_updates(name, 10, 25, 7, interval)


@pytest.mark.parametrize("name", ["trickle", "churn", "hydrate"])
@pytest.mark.parametrize("intervals", [0, 1, 2, 3, 6])
def test_expected_is_the_consolidated_sum(name: str, intervals: int) -> None:
    w = Workload(name, rows_per_interval=4, snapshot_rows=9, interval_ms=10)
    total: Counter = Counter()
    for i in range(intervals):
        for (k, v, _ts), d in spec_updates(name, 4, 9, 10, i).items():
            total[(k, v)] += d
    as_of = max(intervals * 10 - 1, 0)
    want = sorted((k, v, as_of, d) for (k, v), d in total.items() if d != 0)
    got = w.expected(intervals)
    assert [tuple(r.values()) for r in got.to_pylist()] == want


def test_values_match_python_formatting() -> None:
    import numpy as np

    keys = np.array([0, 1, 255, 2**40 + 7, 2**63 - 1], dtype=np.int64)
    assert values(keys).to_pylist() == [format(int(k), "032x") for k in keys]


def test_bad_shapes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown workload 'drizzle'"):
        Workload("drizzle", rows_per_interval=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rows_per_interval"):
        Workload("trickle", rows_per_interval=-1)
    with pytest.raises(ValueError, match="worker 3"):
        Workload("trickle", rows_per_interval=1).updates(0, 3, 3)


# --- your own workloads: loading, any schema, verification by digest --------------

import msgspec  # noqa: E402

from shardsink import (  # noqa: E402
    ClusterConfig,
    open_shard,
    workloads as W,
)
from shardsink.persist.batches import build_batch  # noqa: E402
from shardsink.persist.digest import digest  # noqa: E402
from shardsink.persist.errors import CorruptState  # noqa: E402
from shardsink.persist.stats import ShardStats  # noqa: E402

EXAMPLE = "examples/orders.py:Orders"


def _config(**kw) -> ClusterConfig:
    return ClusterConfig(**kw)


def test_a_file_workload_is_found_and_given_its_table():
    config = _config(workload=W.resolve(EXAMPLE), workload_args={"rows_per_interval": 12})
    workload = W.of(config)
    assert workload.rows == 12
    schema = W.shard_schema(workload, EXAMPLE)
    assert schema.names == ["key", "val", "ts", "diff"]
    table = W.updates(workload, schema, 3, 1, 4, 3000)
    assert set(table["ts"].to_pylist()) == {3000} and table.schema == schema


def test_the_cluster_settings_fill_what_the_table_leaves():
    workload = W.of(_config(workload=W.resolve(EXAMPLE), rows_per_interval=7))
    assert workload.rows == 7


@pytest.mark.parametrize(
    ("spec", "args", "error"),
    [
        ("nosuch", {}, "unknown workload 'nosuch'"),
        ("examples/none.py:X", {}, "no file examples/none.py"),
        ("shardsink.workloads.builtin:Nope", {}, "has no Nope"),
        ("no_such_module_x:Y", {}, "cannot import no_such_module_x"),
        (EXAMPLE, {"colour": 1}, "unexpected keyword argument 'colour'"),
        ("shardsink.workloads.builtin:SCHEMA", {}, "is not a workload"),
        ("trickle", {"colour": 1}, "takes rows_per_interval and snapshot_rows, not colour"),
    ],
)
def test_a_bad_workload_is_named_in_one_line(spec, args, error):
    with pytest.raises(ValueError, match=error):
        W.of(_config(workload=W.resolve(spec), workload_args=args))


def test_a_workload_table_in_a_config_file(tmp_path):
    from shardsink.options import build, layered

    path = tmp_path / "c.toml"
    path.write_text(f'groups = 1\n[workload]\nuse = "{EXAMPLE}"\nrows_per_interval = 3\n')
    config = build(ClusterConfig, layered(ClusterConfig, path, {}))
    assert (config.workload, config.workload_args) == (EXAMPLE, {"rows_per_interval": 3})
    flagged = build(ClusterConfig, layered(ClusterConfig, path, {"workload": "x.py:Y"}))
    assert (flagged.workload, flagged.workload_args) == ("x.py:Y", {"rows_per_interval": 3})


class _Lists:
    schema = pa.schema([("key", pa.int64()), ("val", pa.struct([("tags", pa.list_(pa.int8()))]))])

    def updates(self, interval, worker, workers):
        raise AssertionError("never asked")


def test_a_list_field_arrow_cannot_sort_is_a_shards_field():
    """Lists are compared by value (:mod:`shardsink.persist.values`), not refused."""
    schema = W.shard_schema(_Lists(), "mine")
    assert schema.field("val").type == _Lists.schema.field("val").type


def _damaged_shard(tmp_path, damage: str):
    """Three intervals of the example workload appended by one writer, the
    second's batch damaged: its digest is what was meant, its parts hold
    ``damage`` (one value changed, one writer's rows dropped, doubled)."""
    workload = W.of(_config(workload=W.resolve(EXAMPLE), rows_per_interval=20))
    schema = W.shard_schema(workload, EXAMPLE)
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/c.db"}
    shard = open_shard("s", **stores, schema=schema)
    writer = shard.writer()
    for i in range(3):
        tables = [W.updates(workload, schema, i, w, 2, i * 1000) for w in range(2)]
        meant = digest(tables[0]) + digest(tables[1])
        if i == 1 and damage == "changed":
            val = tables[0]["val"].combine_chunks()
            status = val.field("status").to_pylist()
            status[0] = "lost"
            fixed = pa.StructArray.from_arrays(
                [pa.array(status), val.field("amount"), val.field("qty")], fields=list(val.type)
            )
            tables[0] = tables[0].set_column(1, "val", fixed)
        elif i == 1 and damage == "dropped":
            tables = tables[1:]
        elif i == 1 and damage == "doubled":
            tables = tables + tables
        batches = [
            build_batch(shard.blob, "s", t, i * 1000, (i + 1) * 1000, writer=writer.writer_id,
                        inline_max_bytes=0, target_bytes=1 << 20, stats=ShardStats())
            for t in tables
        ]  # fmt: skip
        share = [msgspec.structs.replace(b, digest=None) for b in batches]
        share[0] = msgspec.structs.replace(share[0], digest=meant)
        for b in share[1:]:
            share[0] = msgspec.structs.replace(
                share[0], parts=share[0].parts + b.parts, rows=share[0].rows + b.rows
            )
        writer.compare_and_append([share[0]], i * 1000, (i + 1) * 1000)
    return shard, workload


@pytest.mark.parametrize("damage", ["changed", "dropped", "doubled"])
def test_shard_verify_and_the_run_name_the_damaged_interval(tmp_path, damage):
    from shardsink.cli import main
    from shardsink.cluster.verify import verify

    shard, workload = _damaged_shard(tmp_path, damage)
    with shard:
        report = shard.verify()
        assert not report.ok and report.digested == 3
        (problem,) = report.problems
        assert problem.startswith("interval [1000, 2000)") and ".parquet" in problem
        assert ("a value changed" in problem) == (damage == "changed")
        run = verify(shard, workload, 1000)
        assert not run.ok and "interval [1000, 2000)" in run.detail
        # a merge of the damaged batch would launder it: it is refused, the
        # inputs (the evidence) stay as they are
        with pytest.raises(CorruptState, match=r"\[0, 3000\) holds .* its inputs were written"):
            shard.compact()
        after = shard.verify().problems
        assert after == report.problems
    code = main(["shard", "verify", "--shard", "s", "--blob", f"file://{tmp_path}/blob",
                 "--consensus", f"sqlite://{tmp_path}/c.db"])  # fmt: skip
    assert code != 0


def test_an_undamaged_shard_verifies_through_compaction(tmp_path):
    shard, workload = _damaged_shard(tmp_path, "none")
    with shard:
        from shardsink.cluster.verify import verify

        assert shard.verify().ok
        shard.advance_since(1500)
        shard.compact()
        report = shard.verify()
        assert report.ok and report.digested >= 1
        assert verify(shard, workload, 1000).ok


class _AppendsWhenVerified:
    """``shard``, whose :meth:`verify` first lets another writer append
    interval ``then``: a second cluster following the shard as a replica
    appended between a read-back's two reads once."""

    def __init__(self, shard, other, workload, schema, then: int):
        self._shard, self._other = shard, other
        self._workload, self._schema, self._then = workload, schema, then

    def __getattr__(self, name):
        return getattr(self._shard, name)

    def verify(self):
        _append_interval(self._other, self._workload, self._schema, self._then)
        return self._shard.verify()


def _append_interval(shard, workload, schema, i: int) -> None:
    writer = shard.writer()
    table = W.updates(workload, schema, i, 0, 1, i * 1000)
    batch = build_batch(shard.blob, "s", table, i * 1000, (i + 1) * 1000, writer=writer.writer_id,
                        inline_max_bytes=0, target_bytes=1 << 20, stats=ShardStats())  # fmt: skip
    writer.compare_and_append([batch], i * 1000, (i + 1) * 1000)


def test_a_read_back_is_as_of_the_upper_it_read(tmp_path):
    from shardsink.cluster.verify import verify

    workload = W.of(_config(workload="trickle", rows_per_interval=20))
    schema = W.shard_schema(workload, "trickle")
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/c.db"}
    with (
        open_shard("s", **stores, schema=schema) as shard,
        open_shard("s", **stores, schema=schema) as other,
    ):
        for i in range(3):
            _append_interval(shard, workload, schema, i)
        run = verify(_AppendsWhenVerified(shard, other, workload, schema, 3), workload, 1000)
        assert run.ok, run.detail
        assert run.intervals == 3 and other.upper == 4000


# --- synth ------------------------------------------------------------------------

import numpy as np  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from shardsink.persist import parts as P  # noqa: E402
from shardsink.workloads.synth import Synth  # noqa: E402


def _synth(**kw) -> Synth:
    args = {
        "rows_per_interval": 400,
        "update": 0.3,
        "delete": 0.1,
        "key": "string",
        "columns": {"name": "string", "n": "int32", "x": "float64"},
        "value_bytes": 24,
    }
    return Synth(**{**args, **kw})  # fmt: skip


def test_synth_is_deterministic_per_seed_interval_and_worker():
    a, b = _synth(seed=3), _synth(seed=3)
    for interval in (0, 1, 2, 5):
        assert a.updates(interval, 1, 4).equals(b.updates(interval, 1, 4))
    assert a.updates(1, 1, 4).equals(b.updates(1, 1, 4))  # asked again: replayed
    assert not _synth(seed=4).updates(5, 1, 4).equals(a.updates(5, 1, 4))


@pytest.mark.parametrize("distribution", ["sequential", "uniform", "zipfian", "latest"])
def test_synth_updates_and_deletes_only_what_is_live(distribution):
    workload = _synth(distribution=distribution, worker_skew=1.0)
    schema = W.shard_schema(workload, "synth")
    live = None
    for interval in range(6):
        tables = [W.updates(workload, schema, interval, w, 3, 0) for w in range(3)]
        keys = [set(t["key"].to_pylist()) for t in tables]
        assert not any(keys[i] & keys[j] for i in range(3) for j in range(i + 1, 3))
        batch = pa.concat_tables(tables)
        live = batch if live is None else P.consolidate(pa.concat_tables([live, batch]))
        assert set(live["diff"].to_pylist()) <= {1}  # never retracted what is not there
    inserts = 400 - round(400 * 0.4)
    assert 0 < live.num_rows < 6 * inserts  # some keys were deleted


def test_synth_zipfian_keys_are_skewed_and_workers_too():
    workload = _synth(rows_per_interval=4000, update=0.9, delete=0.0, records=1000)
    workload.updates(0, 0, 1)
    picked = workload._pick(np.random.default_rng(0), 1000, 20_000, 1)
    counts = np.sort(np.bincount(picked, minlength=1000))[::-1]
    assert counts[:10].sum() > 0.2 * counts.sum()  # the hot keys of theta 0.99
    skewed = _synth(worker_skew=2.0, update=0.0, delete=0.0)
    rows = [skewed.updates(0, w, 4).num_rows for w in range(4)]
    assert rows[0] > 2 * rows[3] and sum(rows) == 400


def test_synth_two_kib_values():
    workload = Synth(rows_per_interval=50, value_bytes=2048, update=0.3)
    table = workload.updates(1, 0, 1)
    assert set(pc.utf8_length(table["val"]).to_pylist()) == {2048}


def test_a_struct_schema_reads_exports_and_queries_end_to_end(tmp_path, capsys):
    """The example's string keys and struct values through a writer, the
    reader, export, the manifest and DuckDB and Polars over both."""
    import json

    import duckdb
    import polars

    from shardsink.cli import main
    from shardsink.persist import ShardConfig

    workload = W.of(_config(workload=W.resolve(EXAMPLE), rows_per_interval=30))
    schema = W.shard_schema(workload, EXAMPLE)
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/consensus.db"}
    with open_shard(**stores, schema=schema, config=ShardConfig(inline_max_bytes=0)) as shard:
        writer = shard.writer()
        for i in range(4):
            table = pa.concat_tables(W.updates(workload, schema, i, w, 3, i * 10) for w in range(3))
            writer.compare_and_append_table(P.consolidate(table), i * 10, i * 10 + 10)
        snapshot = shard.snapshot()
        with shard.reader() as reader:
            manifest = reader.manifest()
    # 30 placed (interval 3), 30 shipped (2), the odd half of 1's and 0's shipped
    statuses = [v["status"] for v in snapshot["val"].to_pylist()]
    assert (statuses.count("placed"), statuses.count("shipped")) == (30, 60)
    assert set(snapshot["diff"].to_pylist()) == {1}
    out = tmp_path / "export"
    assert main(["export", "--data-dir", str(tmp_path), "--output", str(out)]) == 0
    capsys.readouterr()

    def rows(table: pa.Table) -> list:
        return sorted((r["key"], json.dumps(r["val"], sort_keys=True)) for r in table.to_pylist())

    expected = rows(snapshot)
    assert rows(polars.scan_parquet(out).collect().to_arrow()) == expected
    assert rows(duckdb.sql(f"select * from read_parquet('{out}')").to_arrow_table()) == expected
    paths = [f"{tmp_path}/blob/{p['key']}" for p in manifest["parts"]]
    query = (
        f"select key, val from read_parquet({paths!r}) where ts <= {manifest['as_of']} "
        "group by key, val having sum(diff) <> 0"
    )
    assert not manifest["inline"] and rows(duckdb.sql(query).to_arrow_table()) == expected


@pytest.mark.parametrize(
    ("spec", "args", "mode"),
    [
        (EXAMPLE, {"rows_per_interval": 40}, "best-effort"),
        ("synth", {"key": "string", "columns": {"a": "string", "b": "int32"},
                   "update": 0.3, "delete": 0.1, "worker_skew": 1.0}, "barrier"),
        ("shardsink.workloads.builtin:SCHEMA", None, None),
    ],
)  # fmt: skip
def test_a_cluster_runs_your_workload_and_verifies_it_by_digest(tmp_path, spec, args, mode):
    from tests.helpers.cluster import run_cluster

    if args is None:
        with pytest.raises(ValueError, match="is not a workload"):
            run_cluster(tmp_path, 1, workload=spec)
        return
    run = run_cluster(
        tmp_path, 4, groups=2, workers=2, mode=mode, workload=spec, workload_args=args,
        rows_per_interval=60,
    )  # fmt: skip
    stats = run.stats
    assert stats.verified is True and stats.appends == 4
    assert stats.verify_detail.startswith("by digest: ")


def test_replay_cuts_a_parquet_dataset_by_time_and_gives_rows_by_key(tmp_path):
    import pyarrow.parquet as pq

    from shardsink.workloads.replay import Replay

    n = range(40)
    table = pa.table({"id": [f"k{i % 7}" for i in n], "price": [float(i) for i in n],
                      "qty": list(n), "t": [i * 250 for i in n]})  # fmt: skip
    pq.write_table(table, tmp_path / "data.parquet")
    workload = Replay(str(tmp_path / "*.parquet"), key="id", val=["price", "qty"], time="t")
    assert workload.intervals == 10
    got = pa.concat_tables(workload.updates(2, w, 3) for w in range(3))
    assert sorted(got["val"].combine_chunks().field("qty").to_pylist()) == [8, 9, 10, 11]
    schema = W.shard_schema(workload, "replay")
    assert W.expected(workload, schema, 3, 2999).num_rows == 12
    with pytest.raises(ValueError, match="has no column 'nope'"):
        Replay(str(tmp_path / "data.parquet"), key="nope")


# --- workloads of several shards ----------------------------------------------------

SHARDED = "examples/orders_lines.py:OrdersLines"


class _Sharded:
    """Two shards; ``returned`` is what ``updates`` gives (a test's choice)."""

    shards = {
        "a": pa.schema([("key", pa.int64()), ("val", pa.string())]),
        "b": pa.schema([("key", pa.string()), ("val", pa.int32())]),
    }

    def __init__(self, returned=None) -> None:
        self.returned = returned

    def updates(self, interval, worker, workers):
        return self.returned

    def expected(self, intervals):
        return {"b": pa.table({"key": ["x"], "val": pa.array([1], pa.int32())})}


def test_a_workload_of_shards_is_loaded_with_each_shards_schema():
    config = _config(workload=W.resolve(SHARDED), workload_args={"rows_per_interval": 6})
    config, workload, schemas = W.prepare(config)
    assert W.is_sharded(workload) and list(schemas) == ["orders", "lines"]
    assert schemas["lines"].names == ["key", "val", "ts", "diff"]
    assert W.shard_schema(workload, SHARDED, "orders") == schemas["orders"]
    with pytest.raises(ValueError, match="writes shards orders, lines: not 'default'"):
        W.shard_schema(workload, SHARDED, "default")
    with pytest.raises(ValueError, match="writes shards orders, lines: which one"):
        W.shard_schema(workload, SHARDED)
    tables = W.shard_updates(workload, schemas, 1, 0, 2, 1000)
    assert list(tables) == ["orders", "lines"]
    assert all(set(t["ts"].to_pylist()) == {1000} for t in tables.values())
    assert tables["lines"].schema == schemas["lines"]
    # a workload of one schema is one shard, the one the config names
    _, trickle, one = W.prepare(_config(workload="trickle", shard="mine"))
    assert list(one) == ["mine"] and not W.is_sharded(trickle)
    assert W.shard_updates(trickle, one, 0, 0, 1, 0)["mine"].num_rows == 1000


def test_a_shard_left_out_gets_no_rows_and_an_unknown_one_is_refused():
    schemas = W.shard_schemas(_Sharded(), "mine")
    only_b = W.shard_updates(_Sharded({"b": pa.table({"key": ["k"], "val": [3]})}), schemas,
                             0, 0, 1, 0)  # fmt: skip
    assert only_b["a"].num_rows == 0 and only_b["a"].schema == schemas["a"]
    assert only_b["b"].to_pylist() == [{"key": "k", "val": 3, "ts": 0, "diff": 1}]
    with pytest.raises(ValueError, match=r"returned shards 'c' it does not declare"):
        W.shard_updates(_Sharded({"c": pa.table({"key": [1], "val": ["v"]})}), schemas,
                        0, 0, 1, 0)  # fmt: skip
    with pytest.raises(ValueError, match="returned Table, not a dict of tables by shard"):
        W.shard_updates(_Sharded(pa.table({"key": [1], "val": ["v"]})), schemas, 0, 0, 1, 0)
    with pytest.raises(ValueError, match=r"updates\(0, 0, 1\)\['a'\] returned no column 'val'"):
        W.shard_updates(_Sharded({"a": pa.table({"key": [1]})}), schemas, 0, 0, 1, 0)
    # expected: a shard left out is empty
    assert W.expected(_Sharded(), schemas["a"], 1, 999, "a").num_rows == 0
    assert W.expected(_Sharded(), schemas["b"], 1, 999, "b")["key"].to_pylist() == ["x"]


@pytest.mark.parametrize(
    ("shards", "error"),
    [
        ({}, "non-empty dict"),
        ([("a", pa.schema([("key", pa.int64()), ("val", pa.int64())]))], "non-empty dict"),
        ({".a": pa.schema([("key", pa.int64()), ("val", pa.int64())])}, "invalid shard name"),
        ({"a": "int64"}, "shard 'a' has a str, not a pyarrow.Schema"),
        ({"a": pa.schema([("k", pa.int64()), ("val", pa.int64())])}, "exactly the fields key"),
    ],
)
def test_bad_shards_are_named_in_one_line(shards, error):
    class Bad:
        def updates(self, interval, worker, workers):
            return {}

    Bad.shards = shards
    with pytest.raises(ValueError, match=error):
        W.shard_schemas(Bad(), "bad")


def test_a_workloads_check_is_called_on_the_snapshots_and_named_when_it_fails():
    workload = W.of(_config(workload=W.resolve(SHARDED), rows_per_interval=8))
    schemas = W.shard_schemas(workload, SHARDED)
    snapshots = {name: W.expected(workload, schema, 3, 2999, name)
                 for name, schema in schemas.items()}  # fmt: skip
    assert W.check(workload, snapshots) is None
    orphaned = {**snapshots, "orders": snapshots["orders"].slice(1)}  # order 1 gone, not its line
    assert W.check(workload, orphaned) == "line 0000000001-0 points to order 1, not there"
    short = {**snapshots, "lines": snapshots["lines"].slice(1)}
    assert W.check(workload, short).startswith("order 1 totals")
    assert W.check(W.of(_config(workload="trickle")), {"default": snapshots["orders"]}) is None

    class Raising:
        shards = schemas

        def updates(self, interval, worker, workers):
            return {}

        def check(self, snapshots):
            return 3

    with pytest.raises(ValueError, match=r"check\(orders, lines\) returned int"):
        W.check(Raising(), snapshots)


def test_the_example_of_two_shards_adds_up_to_its_expected_collections():
    """Every worker's updates of every interval, summed, are ``expected``
    shard by shard (the exact check the cluster's read-back makes)."""
    workload = W.of(_config(workload=W.resolve(SHARDED), rows_per_interval=9))
    schemas = W.shard_schemas(workload, SHARDED)
    total = {name: [] for name in schemas}
    for i in range(5):
        for w in range(4):
            for name, table in W.shard_updates(workload, schemas, i, w, 4, 0).items():
                total[name].append(table)
        for name, schema in schemas.items():
            summed = P.consolidate(pa.concat_tables(total[name]))
            assert summed.equals(W.expected(workload, schema, i + 1, 0, name)), (i, name)
    # deletes and updates across intervals: orders 0, 4 and 8 are gone by interval 2
    orders = W.expected(workload, schemas["orders"], 3, 0, "orders")["key"].to_pylist()
    assert 0 not in orders and 1 in orders and len(orders) == 3 * 9 - 3
