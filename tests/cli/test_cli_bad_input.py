"""Bad input a newcomer meets: each is one line on stderr naming the problem
and the fix, a non-zero exit, no traceback; a missing extra names the
``pip install 'shardsink[...]'`` that brings it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardsink import datadir, open_shard
from shardsink.cli import main

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
FIX = "give --data-dir a directory you can write"


def one_line(capsys, argv: list[str], code: int = 2) -> str:
    """Run ``shardsink argv``; assert it exits ``code`` with one line on
    stderr; return that line."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_data_dir_under_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    err = one_line(capsys, ["up", "--data-dir", str(tmp_path / "f" / "d"), "--intervals", "1"])
    assert f"cannot use data dir {tmp_path}/f/d: {tmp_path}/f is a file, not a directory" in err
    assert err.startswith("shardsink up: error: ") and FIX in err


def test_a_data_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=f"exists and is not a directory; {FIX}"):
        datadir.create(tmp_path / "f")


def test_a_data_dir_under_proc(capsys):
    err = one_line(capsys, ["up", "--data-dir", "/proc/shardsink-data", "--intervals", "1"])
    assert "cannot use data dir /proc/shardsink-data: its file system makes no directories" in err
    assert FIX in err


def test_a_consensus_server_on_a_data_dir_under_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    argv = ["consensus", "serve", "--bind", f"ipc://{tmp_path}/s/sock"]
    err = one_line(capsys, [*argv, "--data-dir", str(tmp_path / "f" / "d")])
    assert f"{tmp_path}/f is a file, not a directory" in err and FIX in err


def _unprivileged() -> list[str]:
    """A prefix that runs a command so that permission bits bind it: as
    root, without the capabilities that override them (``setpriv``)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: permission bits do not bind root")
    drop = "-dac_override,-dac_read_search,-fowner"
    return ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}"]


def _command(prefix: list[str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "shardsink.cli", *argv],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )


def test_a_data_dir_under_a_parent_that_is_not_writable(tmp_path):
    parent = tmp_path / "locked"
    parent.mkdir(mode=0o500)
    try:
        proc = _command(_unprivileged(), "up", "--data-dir", str(parent / "d"), "--intervals", "1")
        existing = parent / "e"
        parent.chmod(0o700)
        existing.mkdir(mode=0o500)
        parent.chmod(0o500)
        read = _command(_unprivileged(), "up", "--data-dir", str(existing), "--intervals", "1")
    finally:
        parent.chmod(0o700)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"{parent} does not let this user" in proc.stderr and FIX in proc.stderr
    # an existing data dir it may not write: refused when taking its lock
    assert read.returncode == 2 and len(read.stderr.splitlines()) == 1, read.stderr
    assert f"{existing} does not let this user" in read.stderr


def _read_only_mount(directory: Path, then: str) -> subprocess.CompletedProcess:
    """Run the shell command ``then`` with a read-only tmpfs on ``directory``,
    in a mount namespace of its own (skip if none can be made here)."""
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    probe = subprocess.run([*unshare, "true"], capture_output=True, timeout=30)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip("no mount namespace here for a read-only file system")
    script = f"mount -t tmpfs -o ro tmpfs {directory} && {then}"
    return subprocess.run(
        [*unshare, "sh", "-c", script], capture_output=True, text=True, env=ENV, timeout=120
    )


def test_a_data_dir_on_a_read_only_file_system(tmp_path):
    (tmp_path / "ro").mkdir()
    up = f"{sys.executable} -m shardsink.cli up --data-dir {tmp_path}/ro/d --intervals 1"
    proc = _read_only_mount(tmp_path / "ro", up)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"cannot use data dir {tmp_path}/ro/d: it is on a read-only file system" in proc.stderr


def test_a_postgres_consensus_without_psycopg(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # not importable, as if not installed
    store = "postgresql://shardsink@127.0.0.1:1/shardsink"
    blob = f"file://{tmp_path}/blob"
    err = one_line(capsys, ["read", "--blob", blob, "--consensus", store])
    assert err == (
        "shardsink read: error: a postgresql:// consensus store needs psycopg, which is not "
        "installed: pip install 'shardsink[postgres]'"
    )
    data = str(tmp_path / "d")
    err = one_line(capsys, ["up", "--data-dir", data, "--consensus", store, "--intervals", "1"])
    assert "pip install 'shardsink[postgres]'" in err


@pytest.mark.parametrize("gone", ["matplotlib", "deltalake"])
def test_bench_cluster_without_the_bench_extra_runs_nothing(capsys, tmp_path, monkeypatch, gone):
    monkeypatch.setitem(sys.modules, gone, None)
    out = tmp_path / "out"
    err = one_line(capsys, ["bench", "cluster", "--out", str(out), "--quick"])
    assert err == (
        f"shardsink bench: error: bench cluster needs {gone}, which is not installed: "
        "pip install 'shardsink[bench]'"
    )
    assert not out.exists()  # checked before the first run


def test_read_output_a_directory(capsys, tmp_path):
    (tmp_path / "out").mkdir()
    store = ["--blob", f"file://{tmp_path}/blob", "--consensus", f"sqlite://{tmp_path}/c.db"]
    with open_shard(blob=store[1], consensus=store[3], create=True):
        pass
    err = one_line(capsys, ["read", *store, "--output", str(tmp_path / "out")])
    assert err.endswith(f"--output {tmp_path}/out: is a directory; give a file path")
    # a name ending in / means a directory, even where there is none yet
    with pytest.raises(SystemExit) as exit:
        main(["read", *store, "--output", f"{tmp_path}/new/"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert exit.value.code == 2 and "(it ends in /); give a file path" in err
    assert not (tmp_path / "new").exists() and list((tmp_path / "out").iterdir()) == []


def test_a_dashboard_on_every_interface_is_refused_in_words_about_http(capsys, tmp_path):
    data = tmp_path / "d"
    err = one_line(capsys, ["up", "--data-dir", str(data), "--dashboard", "0.0.0.0:8080"])
    assert "refusing to serve HTTP on 0.0.0.0:8080: the page has no login" in err
    assert "ssh -L 8080:127.0.0.1:8080" in err and "CURVE" not in err
    assert not data.exists()


@pytest.mark.parametrize(("call", "gone"), [("to_duckdb", "duckdb"), ("to_polars", "polars")])
def test_reading_into_an_engine_without_the_read_extra(tmp_path, monkeypatch, call, gone):
    monkeypatch.setitem(sys.modules, gone, None)
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/c.db"}
    needs = rf"needs {gone}, .*: pip install 'shardsink\[read\]'"
    with (
        open_shard(**stores, create=True) as shard,
        shard.reader() as reader,
        pytest.raises(ValueError, match=needs),
    ):
        getattr(reader, call)()
