"""What the shard commands say to a person: ``shard list``; a shard that is
not there is never created and is named with the shards that are; ``shard
history`` names compactions and gives UTC times with their zone; ``shard gc``
prints counts and bytes (``--json`` the keys); ``read --format jsonl`` and
no binary to a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import shardsink
from shardsink import ShardNotFound, open_shard
from shardsink.cli import main
from shardsink.persist.config import ShardConfig
from shardsink.workloads import Workload

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "shardsink.cli"]
CHURN = Workload("churn", rows_per_interval=200)
INTERVALS = 4
#: Every part to blob, so that a compaction retires blobs for gc to delete.
BLOB_PARTS = ShardConfig(inline_max_bytes=0, inline_total_max_bytes=0)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def data_dir(tmp_path):
    """Shards ``default`` (INTERVALS churn intervals, every part in blob)
    and ``other`` (empty) in ``tmp_path``."""
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/consensus.db"}
    with open_shard(**stores, config=BLOB_PARTS, create=True) as shard:
        writer = shard.writer()
        for i in range(INTERVALS):
            lower = i * CHURN.interval_ms
            writer.compare_and_append_table(CHURN.updates(i), lower, lower + CHURN.interval_ms)
    with open_shard("other", **stores, create=True):
        pass
    return tmp_path


def test_shard_list_names_the_shards_of_a_store(capsys, data_dir, tmp_path):
    assert run(capsys, "shard", "list", "--data-dir", str(data_dir)) == (0, "default\nother\n", "")
    store = f"sqlite://{data_dir}/consensus.db"
    assert run(capsys, "shard", "list", "--consensus", store) == (0, "default\nother\n", "")
    _, out, _ = run(capsys, "shard", "list", "--data-dir", str(data_dir), "--json")
    assert json.loads(out) == ["default", "other"]
    empty = f"sqlite://{tmp_path}/empty.db"
    assert run(capsys, "shard", "list", "--consensus", empty) == (0, "", f"no shards in {empty}\n")
    code, _, err = run(capsys, "shard", "list", "--consensus", "ipc:///tmp/x/sock")
    assert code == 2 and "is a consensus server, which does not list its shards" in err


def test_a_missing_shard_is_named_with_the_existing_ones_and_not_created(capsys, data_dir):
    for argv in (["read"], ["export", "--output", str(data_dir / "e")], ["shard", "inspect"]):
        code, _, err = run(capsys, *argv, "--data-dir", str(data_dir), "--shard", "defualt")
        assert code == 2 and len(err.splitlines()) == 1, err
        assert "shard 'defualt' does not exist" in err
        assert err.rstrip().endswith("it holds 'default', 'other'; did you mean 'default'?"), err
    stores = {"blob": f"file://{data_dir}/blob", "consensus": f"sqlite://{data_dir}/consensus.db"}
    with pytest.raises(ShardNotFound, match="did you mean 'default'"):
        open_shard("defualt", **stores, create=False)
    assert run(capsys, "shard", "list", "--data-dir", str(data_dir))[1] == "default\nother\n"


def test_history_names_compactions_and_gives_utc_times(capsys, data_dir):
    d = str(data_dir)
    assert run(capsys, "shard", "compact", "--data-dir", d)[0] == 0
    code, out, _ = run(capsys, "shard", "history", "--data-dir", d)
    lines = out.splitlines()
    assert code == 0 and len(lines) == INTERVALS + 1, out
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    for i, line in enumerate(lines[:INTERVALS]):
        lower = i * CHURN.interval_ms
        assert re.fullmatch(
            rf"seqno \d+  append \[{lower}, {lower + CHURN.interval_ms}\): \d+ rows, \d+ parts?, "
            rf"[\d.]+ (B|KiB); upper {lower + CHURN.interval_ms}; writer w-\S+ at {stamp}",
            line,
        ), line
    assert re.fullmatch(
        r"seqno \d+  compaction: \d+ batches merged into \d+ \(\d+ rows, \d+ parts?, .+\)",
        lines[-1],
    ), lines[-1]
    assert "None" not in out and "writer -" not in out
    entries = json.loads(run(capsys, "shard", "history", "--data-dir", d, "--json")[1])
    assert [e["kind"] for e in entries] == ["append"] * INTERVALS + ["compaction"]


def test_gc_prints_a_summary_and_json_lists_the_keys(capsys, data_dir):
    d = str(data_dir)
    assert run(capsys, "shard", "compact", "--data-dir", d)[0] == 0
    blobs = {p for p in (data_dir / "blob").rglob("*") if p.is_file()}
    code, out, _ = run(capsys, "shard", "gc", "--data-dir", d)
    gone = {p for p in blobs if not p.exists()}
    size = sum(1 for _ in gone)
    assert code == 0 and size > 0
    lines = out.splitlines()
    assert re.fullmatch(
        rf"gc of shard 'default': deleted {size} retired blobs?, [\d.]+ (B|KiB|MiB) in all",
        lines[0],
    ), out
    assert lines[1].startswith("  expired 0 readers and 0 writers; readers hold seqno ")
    assert lines[2].startswith("  truncated ") and lines[-1] == "  (--json lists every key)"
    # again, with --json: nothing left to delete, every field named
    code, out, _ = run(capsys, "shard", "gc", "--data-dir", d, "--json")
    report = json.loads(out)
    assert code == 0 and report["blobs_deleted"] == [] and report["bytes_deleted"] == 0


def test_gc_counts_the_bytes_it_deleted(capsys, data_dir):
    d = str(data_dir)
    run(capsys, "shard", "compact", "--data-dir", d)
    sizes = {
        str(p.relative_to(data_dir / "blob")): p.stat().st_size
        for p in (data_dir / "blob").rglob("*")
        if p.is_file()
    }
    report = json.loads(run(capsys, "shard", "gc", "--data-dir", d, "--json")[1])
    assert report["blobs_deleted"]
    assert report["bytes_deleted"] == sum(sizes[k] for k in report["blobs_deleted"])


def test_read_jsonl_is_one_object_per_line(capsys, data_dir):
    code, out, _ = run(capsys, "read", "--data-dir", str(data_dir), "--format", "jsonl")
    rows = [json.loads(line) for line in out.splitlines()]
    expected = CHURN.expected(INTERVALS)
    assert code == 0 and len(rows) == expected.num_rows
    assert rows[0] == expected.slice(0, 1).to_pylist()[0]
    assert (
        json.loads(run(capsys, "read", "--data-dir", str(data_dir), "--format", "json")[1]) == rows
    )


def test_read_refuses_binary_to_a_terminal(capsys, data_dir):
    leader, terminal = pty.openpty()
    try:
        proc = subprocess.run(
            [*COMMAND, "read", "--data-dir", str(data_dir), "--format", "parquet"],
            stdout=terminal,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
        named = os.ttyname(terminal)
        argv = ["read", "--data-dir", str(data_dir), "--format", "parquet", "--output", named]
        code, _, err = run(capsys, *argv)
    finally:
        os.close(terminal)
        os.close(leader)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "--format parquet is binary and stdout is a terminal: write it with --output" in (
        proc.stderr
    )
    assert code == 2 and f"--output {named} is a terminal" in err, err


def test_read_only_commands_leave_the_shards_state_as_it_was(capsys, data_dir, tmp_path):
    """Under the data dir's lock nothing else collects garbage: inspect,
    history, manifest, verify, read and export read without a reader lease
    and write no version (through a consensus server they lease: see
    docs/operating.md)."""

    def seqno() -> int:
        _, out, _ = run(capsys, "shard", "inspect", "--data-dir", str(data_dir), "--json")
        return json.loads(out)["seqno"]

    before = seqno()
    commands = [
        ["shard", "inspect"], ["shard", "history"], ["shard", "manifest"], ["shard", "verify"],
        ["read", "--format", "csv"], ["export", "--output", str(tmp_path / "export")],
    ]  # fmt: skip
    for command in commands:
        code, _, err = run(capsys, *command, "--data-dir", str(data_dir))
        assert code == 0, (command, err)
        assert seqno() == before, command


def test_export_of_several_shards_is_one_cut_as_of_one_time(capsys, tmp_path):
    """Two shards appended together for 3 intervals, then one of them alone
    for a fourth: export of both defaults to the last time both sealed, each
    a dataset of its own under DIR; a missing shard writes nothing."""
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/consensus.db"}
    schema = CHURN.schema
    with shardsink.open_shards({"a": schema, "b": schema}, **stores, create=True) as shards:
        for i in range(3):
            txn = shards.transaction()
            txn.append("a", CHURN.updates(i), i * 1000, (i + 1) * 1000)
            txn.append("b", CHURN.updates(i).slice(0, 10), i * 1000, (i + 1) * 1000)
            txn.commit()
        shards.writer("a").compare_and_append_table(CHURN.updates(3), 3000, 4000)
        want = shards.snapshots(2999)
    args = ["export", "--blob", stores["blob"], "--consensus", stores["consensus"]]
    code, out, _ = run(capsys, *args, "--shard", "b", "--shard", "a", "--output", f"{tmp_path}/x")
    printed = json.loads(out)
    assert code == 0 and printed["as_of"] == 2999 and list(printed["shards"]) == ["b", "a"]
    assert printed["rows"] == want["a"].num_rows + want["b"].num_rows
    for name in ("a", "b"):
        got = ds.dataset(tmp_path / "x" / name, format="parquet").to_table()
        assert got.equals(want[name]), name
        manifest = pq.read_schema(tmp_path / "x" / name / "_manifest.parquet").metadata
        assert json.loads(manifest[b"shardsink.manifest"])["as_of"] == 2999
    code, _, err = run(capsys, *args, "--shard", "a", "--shard", "c", "--output", f"{tmp_path}/y")
    assert code == 2 and "shard 'c' does not exist" in err
    assert not (tmp_path / "y").exists()
