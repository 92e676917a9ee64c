"""``shardsink bench read`` in miniature: every figure is there, the stream
and DuckDB count the same rows, and the shard verified."""

from __future__ import annotations

import json

from shardsink.bench import read


def test_bench_read_measures_the_stream_and_duckdb_side_by_side(tmp_path):
    result = read.run(tmp_path, rows=(20_000,))
    (row,) = result["runs"]
    assert row["verified"] and row["same_rows"]
    assert row["rows"] == 20_000 + 1000  # the snapshot and one interval more
    assert row["arrow_bytes"] > 0 and row["read_peak_rss"] > 0 and row["duckdb_peak_rss"] > 0
    assert row["batches_rows_per_s"] > 0 and row["duckdb_rows_per_s"] > 0
    assert json.loads((tmp_path / "read.json").read_text()) == result
