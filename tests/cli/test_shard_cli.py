"""``shardsink read``, ``shardsink export`` and ``shardsink shard inspect|compact|gc``."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time

import duckdb
import pyarrow.parquet as pq
import pytest

from shardsink import open_shard
from shardsink.cli import main, shard as shard_cli
from shardsink.persist.config import ShardConfig
from shardsink.workloads import Workload
from tests.helpers.persist import interval_rows


@pytest.fixture
def data_dir(tmp_path):
    """A data directory whose shard ``default`` holds keys 0..4 at ts 0, then
    retracts key 0 at ts 1."""
    with open_shard(
        blob=f"file://{tmp_path}/blob", consensus=f"sqlite://{tmp_path}/consensus.db", create=True
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
    assert [line.split()[0] for line in lines[1:-1]] == ["1", "2", "3", "4"]
    assert lines[1].split() == ["1", format(1, "032x"), "1", "1"]
    assert lines[-1] == "(4 rows)"


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
    lease_ms = ShardConfig().writer_lease_ms
    code, _, err = run(
        capsys, "shard", "gc", "--data-dir", str(data_dir), "--sweep-grace-ms", str(lease_ms - 1)
    )
    assert code == 2 and f"shorter than the writer lease ({lease_ms} ms)" in err, err
    # a part of a writer that crashed before appending it, and left state
    leaked = data_dir / "blob" / "default" / "part" / "crashed.3" / "lost.parquet"
    leaked.parent.mkdir(parents=True)
    leaked.write_bytes(b"PAR1")
    past_grace = time.time() - lease_ms / 1000 - 60
    blobs = [p for p in (data_dir / "blob").rglob("*") if p.is_file()]
    assert len(blobs) >= 2  # the rollup (every part is inline), the leaked part
    for path in blobs:  # everything looks old to the sweep: only the leaked part goes
        os.utime(path, (past_grace, past_grace))
    code, out, _ = run(
        capsys,
        "shard",
        "gc",
        "--data-dir",
        str(data_dir),
        "--sweep-grace-ms",
        str(lease_ms),
        "--json",
    )
    assert code == 0 and json.loads(out)["leaked_blobs_deleted"] == [
        "default/part/crashed.3/lost.parquet"
    ]
    assert not leaked.exists()
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


CHURN = Workload("churn", rows_per_interval=500, interval_ms=10)
INTERVALS = 6


@pytest.fixture
def churn_dir(tmp_path):
    """A data directory whose shard holds the churn workload (retractions
    included) in many small blob parts."""
    config = ShardConfig(inline_max_bytes=0, blob_target_bytes=8192)
    with open_shard(
        blob=f"file://{tmp_path}/blob",
        consensus=f"sqlite://{tmp_path}/consensus.db",
        config=config,
        create=True,
    ) as shard:
        w = shard.writer()
        for i in range(INTERVALS):
            t = i * CHURN.interval_ms
            w.compare_and_append_table(CHURN.updates(i), t, t + CHURN.interval_ms)
    return tmp_path


def test_table_shows_the_first_rows_and_counts_them_all(capsys, churn_dir):
    expected = CHURN.expected(INTERVALS)
    code, out, _ = run(capsys, "read", "--data-dir", str(churn_dir))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 1 + shard_cli.TABLE_ROWS + 1
    assert (
        lines[-1] == f"({shard_cli.TABLE_ROWS} of {expected.num_rows} rows; --limit N shows more)"
    )
    assert lines[1].split()[0] == str(expected["key"][0])
    _, out, _ = run(
        capsys, "read", "--data-dir", str(churn_dir), "--limit", "3", "--columns", "key"
    )
    assert [line.strip() for line in out.splitlines()] == [
        "key",
        *(str(k) for k in expected["key"][:3].to_pylist()),
        f"(3 of {expected.num_rows} rows; --limit N shows more)",
    ]


def test_every_format_streams_the_churn_collection(capsys, churn_dir, tmp_path):
    expected = CHURN.expected(INTERVALS)
    out_file = tmp_path / "snap.parquet"
    code, _, _ = run(
        capsys,
        "read",
        "--data-dir",
        str(churn_dir),
        "--format",
        "parquet",
        "--output",
        str(out_file),
    )
    assert code == 0 and pq.read_table(out_file).equals(expected)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    _, out, _ = run(capsys, "read", "--data-dir", str(churn_dir), "--format", "csv")
    assert [int(r["key"]) for r in csv.DictReader(io.StringIO(out))] == expected["key"].to_pylist()
    _, out, _ = run(
        capsys,
        "read",
        "--data-dir",
        str(churn_dir),
        "--format",
        "json",
        "--columns",
        "diff,key",
        "--limit",
        "1500",
    )
    assert json.loads(out) == expected.select(["diff", "key"]).slice(0, 1500).to_pylist()


def test_export_read_by_duckdb_equals_the_collection_before_and_after_compaction(
    capsys, churn_dir, tmp_path
):
    expected = CHURN.expected(INTERVALS)
    for name in ("before", "after"):
        if name == "after":
            code, out, _ = run(capsys, "shard", "compact", "--data-dir", str(churn_dir))
            assert code == 0 and json.loads(out)["applied"] >= 1
        target = tmp_path / name
        code, out, _ = run(
            capsys,
            "export",
            "--data-dir",
            str(churn_dir),
            "--output",
            str(target),
            "--file-rows",
            "400",
        )
        assert code == 0 and json.loads(out)["rows"] == expected.num_rows
        manifest = export_manifest(target)
        assert manifest["shard"] == "default" and manifest["rows"] == expected.num_rows
        assert manifest["as_of"] == INTERVALS * CHURN.interval_ms - 1
        assert [f["name"] for f in manifest["schema"]] == ["key", "val", "ts", "diff"]
        assert len(manifest["files"]) == -(-expected.num_rows // 400)
        assert (target / "_SUCCESS").is_file()
        got = duckdb.sql(
            f"select * from read_parquet('{target}/*.parquet') order by key, val"
        ).to_arrow_table()
        assert got.cast(expected.schema).equals(expected)


def test_bad_input_is_one_line_and_writes_nothing(capsys, churn_dir, tmp_path):
    """An as-of at or past the upper or below since, an unknown column, an
    output that cannot be written: one line naming it, exit status 2, and no
    file or directory left, not even under a temporary name."""
    d = str(churn_dir)
    upper = INTERVALS * CHURN.interval_ms
    out = str(tmp_path / "out")
    past = f"as_of {upper + 1000} is not below the upper {upper}"
    cases = [
        (["read", "--data-dir", d, "--as-of", str(upper)], f"as_of {upper} is not below the upper"),
        (["read", "--data-dir", d, "--as-of", str(upper + 1000), "--format", "parquet"], past),
        (["read", "--data-dir", d, "--as-of", str(upper + 1000), "--output", out], past),
        (["export", "--data-dir", d, "--as-of", str(upper), "--output", out], f"as_of {upper} is"),
        (["shard", "manifest", "--data-dir", d, "--as-of", str(upper + 1000)], past),
        (["read", "--data-dir", d, "--columns", "key,colour"], "unknown column(s) 'colour'"),
        (["read", "--data-dir", d, "--columns", "key,colour", "--output", out], "'colour'"),
        (
            ["read", "--data-dir", d, "--output", str(tmp_path / "no" / "f")],
            "cannot write --output",
        ),
        (
            ["export", "--data-dir", d, "--output", str(tmp_path / "no" / "x")],
            "cannot write --output",
        ),
        (["export", "--data-dir", d, "--output", str(churn_dir)], "not an empty directory"),
    ]
    below = "as_of 19 is below the since 20"
    since = [
        (["read", "--data-dir", d, "--as-of", "19", "--output", out], below),
        (["export", "--data-dir", d, "--as-of", "19", "--output", out], below),
        (["shard", "manifest", "--data-dir", d, "--as-of", "19"], below),
    ]
    for argv, message in cases:
        code, _, err = run(capsys, *argv)
        assert code == 2 and message in err and len(err.splitlines()) == 1, (argv, err)
    with open_shard(
        blob=f"file://{d}/blob", consensus=f"sqlite://{d}/consensus.db", create=True
    ) as shard:
        shard.advance_since(20)
    for argv, message in since:
        code, _, err = run(capsys, *argv)
        assert code == 2 and message in err and len(err.splitlines()) == 1, (argv, err)
    assert not (tmp_path / "no").exists() and not (tmp_path / "out").exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_bad_input_from_the_command_is_one_line_without_a_traceback(churn_dir):
    """The real ``shardsink`` command: exit status 2, one line on stderr."""
    argv = [sys.executable, "-m", "shardsink.cli", "read", "--data-dir", str(churn_dir)]
    for extra, message in (
        (["--as-of", "999999"], "is not below the upper"),
        (["--columns", "colour"], "unknown column(s) 'colour'"),
    ):
        proc = subprocess.run(argv + extra, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert proc.stderr.startswith("shardsink read: error: ") and message in proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr


def test_export_of_a_shard_never_written(capsys, tmp_path):
    with open_shard(
        blob=f"file://{tmp_path}/blob", consensus=f"sqlite://{tmp_path}/consensus.db", create=True
    ):
        pass
    code, _, _ = run(capsys, "export", "--data-dir", str(tmp_path), "--output", str(tmp_path / "e"))
    manifest = export_manifest(tmp_path / "e")
    assert code == 0 and (manifest["rows"], manifest["as_of"]) == (0, None)
    assert pq.read_table(tmp_path / "e" / manifest["files"][0]).num_rows == 0


def export_manifest(directory):
    """The manifest ``export`` put in ``directory``'s manifest file."""
    meta = pq.read_schema(directory / shard_cli.MANIFEST_NAME).metadata
    return json.loads(meta[shard_cli.MANIFEST_KEY])


def manifest_snapshot(capsys, data_dir, *argv):
    code, out, _ = run(capsys, "shard", "manifest", "--data-dir", str(data_dir), "--json", *argv)
    assert code == 0
    manifest = json.loads(out)
    return manifest, duckdb.sql(manifest["sql"]).to_arrow_table()


def test_manifest_sql_equals_the_collection_before_and_after_compaction(capsys, churn_dir):
    expected = CHURN.expected(INTERVALS)
    manifest, got = manifest_snapshot(capsys, churn_dir)
    assert len(manifest["parts"]) > INTERVALS and manifest["inline"] == []
    assert got.cast(expected.schema).equals(expected)
    run(capsys, "shard", "compact", "--data-dir", str(churn_dir))
    run(capsys, "shard", "gc", "--data-dir", str(churn_dir))
    after, got = manifest_snapshot(capsys, churn_dir)
    assert len(after["parts"]) < len(manifest["parts"])
    assert all(p["key_lo"] <= p["key_hi"] for p in after["parts"])
    assert got.cast(expected.schema).equals(expected)
    as_of = 3 * CHURN.interval_ms - 1
    _, got = manifest_snapshot(capsys, churn_dir, "--as-of", str(as_of))
    assert got.cast(expected.schema).equals(CHURN.expected(3, as_of))


def test_manifest_of_inline_updates_equals_read(capsys, data_dir):
    """The small shard's parts are all inline: the statement reads them from
    the manifest, retraction included."""
    manifest, got = manifest_snapshot(capsys, data_dir)
    assert manifest["parts"] == [] and len(manifest["inline"]) == 6
    assert manifest["rule"].startswith("updates = the rows of every part")
    _, out, _ = run(capsys, "read", "--data-dir", str(data_dir), "--format", "json")
    assert got.to_pylist() == json.loads(out)
    _, got = manifest_snapshot(capsys, data_dir, "--as-of", "0")
    assert got["key"].to_pylist() == [0, 1, 2, 3, 4]
    code, _, err = run(capsys, "shard", "manifest", "--data-dir", str(data_dir), "--as-of", "2")
    assert code == 2 and "not below the upper 2" in err


def test_a_part_missing_for_good_is_named_and_nothing_is_written(capsys, churn_dir, tmp_path):
    blob = churn_dir / "blob"
    (lost,) = sorted((blob / "default" / "part").glob("*/*.parquet"))[-1:]
    assert lost.parent.name != "part"  # under its writer's prefix
    lost.unlink()
    out_file = tmp_path / "snap.parquet"
    code, _, err = run(
        capsys,
        "read",
        "--data-dir",
        str(churn_dir),
        "--format",
        "parquet",
        "--output",
        str(out_file),
    )
    assert code == 2 and f"part '{lost.relative_to(blob)}' is missing" in err, err
    assert not out_file.exists() and not list(tmp_path.glob(".snap.parquet*"))
    code, _, err = run(
        capsys, "export", "--data-dir", str(churn_dir), "--output", str(tmp_path / "x")
    )
    assert code == 2 and lost.name in err and not list(tmp_path.glob("*x*"))


def test_history_lists_appends_and_compactions(capsys, churn_dir):
    d = str(churn_dir)
    run(capsys, "shard", "compact", "--data-dir", d)
    code, out, _ = run(capsys, "shard", "history", "--data-dir", d, "--json")
    entries = json.loads(out)
    appends, merges = entries[:INTERVALS], entries[INTERVALS:]
    assert code == 0 and [e["upper"] for e in appends] == [
        (i + 1) * CHURN.interval_ms for i in range(INTERVALS)
    ]
    assert all(e["writer"] and e["wall_ms"] > 0 and len(e["added"]) == 1 for e in appends)
    assert [e["added"][0]["rows"] for e in appends[:3]] == [500, 500, 1000]
    assert len(merges) == 1 and merges[0]["writer"] is None and merges[0]["upper"] is None
    assert sorted(merges[0]["replaced"]) == sorted(e["added"][0]["batch"] for e in appends)
    code, out, _ = run(capsys, "shard", "history", "--data-dir", d, "--limit", "2")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 and lines[0].startswith(f"seqno {appends[-1]['seqno']} ")
    code, _, err = run(capsys, "shard", "history", "--data-dir", d, "--shard", "other")
    assert code == 2 and "shard 'other' does not exist" in err, err
