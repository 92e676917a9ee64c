"""``shardsink read`` and ``shardsink shard inspect|compact|gc``."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from persist_helpers import interval_rows

from shardsink import open_shard
from shardsink.cli import main
from shardsink.cli import shard as shard_cli


@pytest.fixture
def data_dir(tmp_path):
    """A data directory whose shard ``default`` holds keys 0..4 at ts 0, then
    retracts key 0 at ts 1."""
    with open_shard(
        blob=f"file://{tmp_path}/blob", consensus=f"sqlite://{tmp_path}/consensus.db"
    ) as shard:
        w = shard.writer()
        w.compare_and_append_table(interval_rows(0, [3, 1, 0, 4, 2]), 0, 1)
        w.compare_and_append_table(interval_rows(1, [0], diff=-1), 1, 2)
    return tmp_path


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_read_table_sorted_by_key(capsys, data_dir):
    code, out, _ = run(capsys, "read", "--data-dir", str(data_dir))
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["key", "val", "ts", "diff"]
    assert [line.split()[0] for line in lines[1:]] == ["1", "2", "3", "4"]
    assert lines[1].split() == ["1", format(1, "032x"), "1", "1"]


def test_read_csv_json_as_of(capsys, data_dir):
    _, out, _ = run(capsys, "read", "--data-dir", str(data_dir), "--format", "csv", "--as-of", "0")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["key"] for r in rows] == ["0", "1", "2", "3", "4"]
    assert {r["ts"] for r in rows} == {"0"}
    _, out, _ = run(capsys, "read", "--data-dir", str(data_dir), "--format", "json")
    assert json.loads(out)[0] == {"key": 1, "val": format(1, "032x"), "ts": 1, "diff": 1}


def test_read_parquet_to_file_with_uri_overrides(capsys, data_dir, tmp_path):
    out_file = tmp_path / "snap.parquet"
    code, _, _ = run(
        capsys,
        "read",
        "--blob",
        f"file://{data_dir}/blob",
        "--consensus",
        f"sqlite://{data_dir}/consensus.db",
        "--format",
        "parquet",
        "--output",
        str(out_file),
    )
    table = pq.read_table(out_file)
    assert code == 0 and table.column_names == ["key", "val", "ts", "diff"]
    assert table["key"].to_pylist() == [1, 2, 3, 4]


def test_inspect(capsys, data_dir):
    code, out, _ = run(capsys, "shard", "inspect", "--data-dir", str(data_dir), "--json")
    info = json.loads(out)
    assert code == 0 and (info["upper"], info["since"], info["batches"]) == (2, 0, 2)
    assert info["parts"] == 2 and info["inline_bytes"] > 0 and info["blob_bytes"] == 0
    assert info["readers"] == {} and len(info["writers"]) == 0
    code, out, _ = run(capsys, "shard", "inspect", "--data-dir", str(data_dir))
    assert code == 0 and "upper: 2" in out and "batches: 2" in out


def test_compact_and_gc(capsys, data_dir):
    code, out, _ = run(capsys, "shard", "compact", "--data-dir", str(data_dir))
    assert code == 0 and json.loads(out)["applied"] == 1
    code, out, _ = run(capsys, "shard", "gc", "--data-dir", str(data_dir), "--sweep-grace-ms", "0")
    assert code == 0 and json.loads(out)["leaked_blobs_deleted"] == []
    _, out, _ = run(capsys, "read", "--data-dir", str(data_dir), "--format", "csv")
    assert [r["key"] for r in csv.DictReader(io.StringIO(out))] == ["1", "2", "3", "4"]


def test_errors_are_one_line(capsys, data_dir, tmp_path):
    code, _, err = run(capsys, "read", "--data-dir", str(tmp_path / "nope"))
    assert code == 2 and "no shard store" in err
    code, _, err = run(capsys, "read", "--data-dir", str(data_dir), "--shard", "other")
    assert code == 2 and "shard 'other' does not exist" in err
    code, _, err = run(capsys, "read", "--data-dir", str(data_dir), "--as-of", "7")
    assert code == 2 and "not below the upper 2" in err
    code, _, err = run(capsys, "read")
    assert code == 2 and "--data-dir" in err


def test_a_reader_that_goes_away_is_not_an_error(data_dir):
    """``shardsink read | head``: stdout's reader closes early; exit 0, quietly."""
    argv = [sys.executable, "-m", "shardsink.cli", "read", "--data-dir", str(data_dir)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command writes: its first write breaks the pipe
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err, err


def test_another_broken_pipe_is_a_failure(capsys, data_dir, monkeypatch):
    def broken(args) -> int:
        raise BrokenPipeError("a child's stdin")

    monkeypatch.setattr(shard_cli, "_read", broken)
    with pytest.raises(BrokenPipeError, match="a child's stdin"):
        main(["read", "--data-dir", str(data_dir)])
