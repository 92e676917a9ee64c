"""The plain-pyarrow baseline: every row written, as Parquet, and nothing left behind."""

from __future__ import annotations

import pytest

from shardsink.bench import baseline
from shardsink.storage import open_blob


def test_the_baseline_writes_every_row_and_cleans_up(tmp_path) -> None:
    uri = f"file://{tmp_path}/blob"
    got = baseline.measure(uri, rows=10_000, processes=2, part_rows=3_000)
    assert got["rows"] == 10_000 and got["processes"] == 2
    assert got["bytes"] > 0 and got["rows_per_s"] > 0
    store = open_blob(uri)
    try:
        assert list(store.list()) == []
    finally:
        store.close()


def test_the_baseline_refuses_nothing_to_do(tmp_path) -> None:
    with pytest.raises(ValueError, match="processes, rows and part_rows"):
        baseline.measure(f"file://{tmp_path}/blob", rows=10, processes=0)
