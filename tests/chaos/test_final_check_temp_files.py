"""The chaos run's final check counts temporary files of writers killed
mid-``set`` that the leaked-blob sweep left, as it counts leaked blobs."""

from __future__ import annotations

import time
from pathlib import Path

from shardsink import open_shard
from shardsink.chaos import ChaosConfig
from shardsink.chaos.checks import check_shard
from shardsink.chaos.context import RunContext
from shardsink.persist.config import OFFLINE
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
            check_shard(run, shard, "before the sweep", swept=True)
            assert run.violations == [
                "before the sweep: 1 temporary files remain: "
                "['default/part/x.parquet~4242-0123456789ab']"
            ]
            time.sleep(0.002)  # older than the grace
            assert shard.sweep_leaked_blobs() == ["default/part/x.parquet~4242-0123456789ab"]
            check_shard(run, shard, "after the sweep", swept=True)
            assert len(run.violations) == 1
    finally:
        run.sock_dir.rmdir()
