"""``shardsink export``'s directory is read as it is, without a glob or an
option, by pyarrow.dataset, Polars and DuckDB, and each reads the snapshot
``shardsink read`` prints; the manifest and ``_SUCCESS`` add no rows."""

from __future__ import annotations

import json

import duckdb
import polars
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from shardsink import open_shard
from shardsink.cli import main, shard as shard_cli
from shardsink.workloads import Workload

CHURN = Workload("churn", rows_per_interval=300)
INTERVALS = 4


def test_every_engine_reads_the_export_directory_as_it_is(capsys, tmp_path):
    with open_shard(
        blob=f"file://{tmp_path}/blob", consensus=f"sqlite://{tmp_path}/consensus.db", create=True
    ) as shard:
        writer = shard.writer()
        for i in range(INTERVALS):
            lower = i * CHURN.interval_ms
            writer.compare_and_append_table(CHURN.updates(i), lower, lower + CHURN.interval_ms)
    out = tmp_path / "export"
    argv = ["export", "--data-dir", str(tmp_path), "--output", str(out), "--file-rows", "250"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    expected = CHURN.expected(INTERVALS)
    assert summary["rows"] == expected.num_rows and summary["files"] > 1
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["_SUCCESS", shard_cli.MANIFEST_NAME, *part_files(out)])

    def same(table: pa.Table) -> None:
        table = table.cast(expected.schema).sort_by([("key", "ascending"), ("val", "ascending")])
        assert table.equals(expected)

    same(ds.dataset(out).to_table())
    same(polars.scan_parquet(out).collect().to_arrow())
    # DuckDB by a glob: it reads a directory as it is only from 2.0 (1.1.3: "No files
    # found that match the pattern"), and `from 'DIR'` in none
    same(duckdb.sql(f"select * from read_parquet('{out}/*.parquet')").to_arrow_table())

    manifest = json.loads(
        pq.read_schema(out / shard_cli.MANIFEST_NAME).metadata[b"shardsink.manifest"]
    )
    assert manifest["rows"] == expected.num_rows and manifest["shard"] == "default"
    assert manifest["files"] == part_files(out)
    assert pq.read_metadata(out / shard_cli.MANIFEST_NAME).num_rows == 0
    assert (out / "_SUCCESS").stat().st_size == 0


def part_files(out):
    """The part files of an export, in order."""
    return sorted(p.name for p in out.glob("part-*.parquet"))
