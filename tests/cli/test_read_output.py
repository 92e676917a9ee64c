"""Where ``shardsink read --output`` and ``shardsink export --output`` write:
through symlinks, into FIFOs and devices as they are, never over them, and
atomically into regular files."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import test_shard_cli
from test_shard_cli import run

from shardsink.cli import shard as shard_cli

# The CLI tests' small shard (keys 0..4, then key 0 retracted): a fixture, taken by name.
data_dir = test_shard_cli.data_dir


def csv_of(capsys, data_dir: Path) -> bytes:
    """What ``read --format csv`` prints to stdout: what every target below should get."""
    code, out, _ = run(capsys, "read", "--data-dir", str(data_dir), "--format", "csv")
    assert code == 0
    return out.encode()


def read_to(capsys, data_dir: Path, output: Path, *argv: str):
    return run(
        capsys,
        "read",
        "--data-dir",
        str(data_dir),
        "--format",
        "csv",
        "--output",
        str(output),
        *argv,
    )


def device(tmp_path: Path, name: str, major: int, minor: int) -> Path:
    """``/dev/NAME``, or, where ``/dev`` is writable (as root), a node of the
    same device in ``tmp_path``: the code this tests used to rename a regular
    file over the device, and a regression must not break the machine's own."""
    if not os.access("/dev", os.W_OK):
        return Path("/dev", name)
    node = tmp_path / name
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("/dev is writable here and device nodes cannot be made")
    return node


def no_temporaries(directory: Path) -> bool:
    return [p.name for p in directory.iterdir() if p.name.startswith(".")] == []


def test_a_symlink_stays_a_link_and_its_target_gets_the_data(capsys, data_dir, tmp_path):
    expected = csv_of(capsys, data_dir)
    (tmp_path / "real.csv").write_bytes(b"old\n")
    link = tmp_path / "link.csv"
    link.symlink_to("real.csv")
    code, _, err = read_to(capsys, data_dir, link)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == "real.csv"
    assert (tmp_path / "real.csv").read_bytes() == expected
    assert no_temporaries(tmp_path)


def test_a_dangling_symlink_gets_the_file_it_points_to(capsys, data_dir, tmp_path):
    expected = csv_of(capsys, data_dir)
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.csv"
    link.symlink_to("sub/new.csv")
    code, _, err = read_to(capsys, data_dir, link)
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "sub" / "new.csv").read_bytes() == expected
    assert no_temporaries(tmp_path) and no_temporaries(tmp_path / "sub")


def test_a_fifo_gets_the_bytes_and_stays_a_fifo(capsys, data_dir, tmp_path):
    expected = csv_of(capsys, data_dir)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A second name of the FIFO: if the command never opens it, the reader,
    # blocked opening it, is released through this one.
    spare = tmp_path / "fifo.spare"
    os.link(fifo, spare)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = read_to(capsys, data_dir, fifo)
    reader.join(timeout=10)
    if reader.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(spare, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"
    assert got == [expected]
    assert no_temporaries(tmp_path)


def test_a_link_to_an_open_pipe_writes_into_the_pipe(capsys, data_dir, tmp_path):
    """What ``--output /dev/stdout`` does with stdout a pipe: ``/dev/stdout``
    links to ``/proc/self/fd/1``, which names the pipe without a path."""
    expected = csv_of(capsys, data_dir)
    r, w = os.pipe()
    link = tmp_path / "stdout"
    link.symlink_to(f"/proc/self/fd/{w}")
    with os.fdopen(r, "rb") as pipe:
        try:
            code, _, err = read_to(capsys, data_dir, link)  # small: fits the pipe's buffer
        finally:
            os.close(w)
        got = pipe.read()
    assert code == 0, err
    assert link.is_symlink() and got == expected


def test_stdout_whose_reader_goes_away_is_not_an_error(data_dir, tmp_path):
    """``shardsink read --output /dev/stdout | head``, as without ``--output``:
    exit 0, quietly. Through a link of the test's own to ``/proc/self/fd/1``,
    which is what ``/dev/stdout`` is, so that a regression replaces only it."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    argv = [sys.executable, "-m", "shardsink.cli", "read", "--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        [*argv, "--output", str(link)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # before the command writes: its first write breaks the pipe
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b"", err
    assert link.is_symlink() and no_temporaries(tmp_path)


def test_dev_null_stays_a_character_device(capsys, data_dir, tmp_path):
    null = device(tmp_path, "null", 1, 3)
    for fmt in ("csv", "parquet", "table"):
        code, _, err = read_to(capsys, data_dir, null, "--format", fmt)
        assert code == 0, err
        assert stat.S_ISCHR(os.lstat(null).st_mode), f"{null} was replaced"
    assert no_temporaries(null.parent)


def test_a_full_device_is_one_line_naming_it_and_stays_a_device(capsys, data_dir, tmp_path):
    """``/dev/full`` fails every write with ENOSPC, as a full disk would."""
    full = device(tmp_path, "full", 1, 7)
    for fmt in ("csv", "parquet", "json"):
        try:
            code, _, err = read_to(capsys, data_dir, full, "--format", fmt)
        finally:
            assert stat.S_ISCHR(os.lstat(full).st_mode), f"{full} was replaced"
        assert code == 2 and len(err.splitlines()) == 1, err
        assert str(full) in err and "No space left on device" in err, err
    assert no_temporaries(full.parent)


def test_a_directory_is_one_line_and_nothing_is_written(capsys, data_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    link = tmp_path / "link"
    link.symlink_to("out")
    for target in (out, link):
        code, stdout, err = read_to(capsys, data_dir, target)
        assert code == 2 and stdout == "" and len(err.splitlines()) == 1, err
        assert err.startswith("shardsink read: error: ") and str(target) in err
        assert "is a directory; give a file path" in err
    assert list(out.iterdir()) == [] and no_temporaries(tmp_path)


def test_a_missing_parent_directory_is_named(capsys, data_dir, tmp_path):
    code, _, err = read_to(capsys, data_dir, tmp_path / "no" / "f")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"no directory {tmp_path / 'no'}" in err
    assert not (tmp_path / "no").exists() and no_temporaries(tmp_path)


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(capsys, data_dir, tmp_path):
    expected = csv_of(capsys, data_dir)
    target = tmp_path / "snap.csv"
    target.write_bytes(b"old\n")
    target.chmod(0o640)
    before = os.stat(target)
    code, _, err = read_to(capsys, data_dir, target)
    after = os.stat(target)
    assert code == 0, err
    assert target.read_bytes() == expected
    assert stat.S_IMODE(after.st_mode) == 0o640
    assert after.st_ino != before.st_ino, "written in place, not renamed into place"
    assert no_temporaries(tmp_path)


def test_a_failed_read_leaves_the_regular_file_as_it_was(capsys, data_dir, tmp_path, monkeypatch):
    target = tmp_path / "snap.csv"
    target.write_bytes(b"old\n")

    def half(stream, fmt, limit, out) -> None:
        out.write(b"key,val\n")
        raise ValueError("the shard went away")

    monkeypatch.setattr(shard_cli, "_write", half)
    code, _, err = read_to(capsys, data_dir, target)
    assert code == 2 and "the shard went away" in err
    assert target.read_bytes() == b"old\n" and no_temporaries(tmp_path)


def test_a_new_file_gets_the_parquet_snapshot(capsys, data_dir, tmp_path):
    target = tmp_path / "new.parquet"
    code, _, err = read_to(capsys, data_dir, target, "--format", "parquet")
    assert code == 0, err
    assert pq.read_table(target)["key"].to_pylist() == [1, 2, 3, 4]
    assert no_temporaries(tmp_path)


def export_to(capsys, data_dir: Path, output: Path):
    return run(capsys, "export", "--data-dir", str(data_dir), "--output", str(output))


def test_export_through_a_link_to_an_empty_directory(capsys, data_dir, tmp_path):
    (tmp_path / "out").mkdir()
    link = tmp_path / "link"
    link.symlink_to("out")
    code, _, err = export_to(capsys, data_dir, link)
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "out" / "_SUCCESS").is_file()
    assert no_temporaries(tmp_path)


def test_export_through_a_dangling_link_makes_its_directory(capsys, data_dir, tmp_path):
    link = tmp_path / "link"
    link.symlink_to("out")
    code, _, err = export_to(capsys, data_dir, link)
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "out" / shard_cli.MANIFEST_NAME).is_file()
    assert no_temporaries(tmp_path)


def test_export_refuses_a_link_to_a_file_or_a_device_in_one_line(capsys, data_dir, tmp_path):
    (tmp_path / "file").write_bytes(b"keep\n")
    null = device(tmp_path, "null", 1, 3)
    for name, points_to in (("to-file", tmp_path / "file"), ("to-device", null)):
        link = tmp_path / name
        link.symlink_to(points_to)
        for target in (link, points_to):
            code, _, err = export_to(capsys, data_dir, target)
            assert code == 2 and len(err.splitlines()) == 1, err
            assert str(target) in err and "not an empty directory" in err, err
    assert (tmp_path / "file").read_bytes() == b"keep\n"
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert no_temporaries(tmp_path) and no_temporaries(null.parent)
