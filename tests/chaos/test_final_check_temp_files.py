"""The chaos run's final check counts temporary files of writers killed
mid-``set`` that the leaked-blob sweep left, as it counts leaked blobs."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from shardsink import open_shard, open_shards
from shardsink.chaos import ChaosConfig
from shardsink.chaos.checks import check_shards, sweep_after_run
from shardsink.chaos.context import RunContext
from shardsink.persist.config import OFFLINE
from shardsink.persist.machine import wall_clock_ms
from shardsink.persist.maintenance import register_writer
from shardsink.persist.shard import Shard
from shardsink.storage import open_blob, open_consensus
from shardsink.workloads import SCHEMA


def test_the_final_check_counts_temp_files_until_the_sweep_removes_them(tmp_path) -> None:
    config = ChaosConfig(data_dir=str(tmp_path))
    run = RunContext(config, tmp_path)
    run.data.mkdir()
    try:
        with open_shard(
            "default",
            blob=run.cluster.blob_uri,
            consensus=run.cluster.consensus_uri,
            schema=SCHEMA,
            config=OFFLINE,
        ) as shard:
            shard.writer().compare_and_append_table(config.load_workload().updates(0), 0, 1000)
            # what a writer killed mid-set leaves
            temp = Path(shard.blob.root, "default", "part", "x.parquet~4242-0123456789ab")
            temp.parent.mkdir(parents=True, exist_ok=True)
            temp.write_bytes(b"partial")
            check_shards(run, {"default": shard}, "before the sweep", swept=True)
            assert run.violations == [
                "before the sweep: 1 temporary files remain: "
                "['default/part/x.parquet~4242-0123456789ab']"
            ]
            time.sleep(0.002)  # older than the grace
            assert shard.sweep_leaked_blobs() == ["default/part/x.parquet~4242-0123456789ab"]
            check_shards(run, {"default": shard}, "after the sweep", swept=True)
            assert len(run.violations) == 1
    finally:
        run.sock_dir.rmdir()


def test_the_final_check_finds_an_interval_in_one_shard_only(tmp_path) -> None:
    """Of a workload of several shards, an interval appended to one shard and
    not the other is a violation (their uppers differ), where each shard
    alone would pass."""
    example = Path(__file__).parents[2] / "examples" / "orders_lines.py"
    config = ChaosConfig(data_dir=str(tmp_path), workload=f"{example}:OrdersLines")
    run = RunContext(config, tmp_path)
    run.data.mkdir()
    workload = config.load_workload()
    try:
        with open_shards(
            config.shard_schemas(),
            blob=run.cluster.blob_uri,
            consensus=run.cluster.consensus_uri,
            config=OFFLINE,
        ) as shards:
            for i in range(2):
                transaction = shards.transaction()
                for name, table in workload.updates(i, 0, 1).items():
                    transaction.append(name, _at(table, i * 1000), i * 1000, (i + 1) * 1000)
                transaction.commit()
            both = {name: shards.shard(name) for name in run.shard_names}
            assert check_shards(run, both, "both") == 2 and run.violations == []
            orders = _at(workload.updates(2, 0, 1)["orders"], 2000)
            both["orders"].writer().compare_and_append_table(orders, 2000, 3000)
            check_shards(run, both, "torn")
    finally:
        run.sock_dir.rmdir()
    assert len(run.violations) == 1 and "the shards' uppers differ" in run.violations[0]


def _at(table: pa.Table, ts: int) -> pa.Table:
    """A workload's ``key``, ``val``, ``diff`` rows as a shard's, at ``ts``."""
    stamped = table.append_column("ts", pa.array([ts] * len(table), pa.uint64()))
    return stamped.select(["key", "val", "ts", "diff"])


def test_a_writer_seen_by_a_clock_ahead_is_swept_after_the_run(tmp_path) -> None:
    """A writer killed mid-``set`` whose last sight a server's clock ten
    minutes ahead recorded: after the run its temporary file is swept, not
    kept by a lease this clock counts from that sight."""
    blob_uri, store_uri = f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/consensus.db"
    ahead = lambda: wall_clock_ms() + 600_000  # noqa: E731
    with Shard.open(
        "default",
        blob=open_blob(blob_uri),
        consensus=open_consensus(store_uri),
        schema=SCHEMA,
        config=OFFLINE,
        clock=ahead,
    ) as skewed:
        killed = register_writer(skewed.machine, "killed")
    temp = Path(tmp_path, "blob", "default", "part", killed, "x.parquet~4242-0123456789ab")
    temp.parent.mkdir(parents=True)
    temp.write_bytes(b"partial")
    time.sleep(0.002)  # older than the 1 ms grace
    with open_shard("default", blob=blob_uri, consensus=store_uri, config=OFFLINE) as shard:
        assert killed in shard.state(refresh=True).writers
        shard.sweep_leaked_blobs()
        assert temp.exists()  # a live writer's, as a lease on this clock says
        assert sweep_after_run(shard) == 1
        assert not temp.exists() and not shard.state(refresh=True).writers
