"""``shardsink up`` within the machine's means: a shape it has no room for is
refused before any process starts, with one line naming the flags and the
limit, and Ctrl-C or SIGTERM stop a cluster at any moment of its start,
leaving no process and no shared-memory segment (issue 41: ``up --groups
100000`` forked about 3,000 processes, left 600 zombies and ignored SIGTERM
for 7 minutes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
import setproctitle

from shardsink.cli import main
from tests.conftest import SHM_DIR, SHM_PREFIX
from tests.helpers.cli import ENV
from tests.helpers.wait import wait_until

GROUPS, WORKERS = 16, 8
#: The start's processes: the groups' members, the zygote and the consensus process.
CHILDREN = GROUPS * (WORKERS + 1) + 2

#: A workload whose workers never come up: the start waits for them until stopped.
HELD = """
import time

import pyarrow as pa
import setproctitle


class Held:
    schema = pa.schema([("key", pa.int64()), ("val", pa.string())])

    def __init__(self):
        if setproctitle.getproctitle().startswith("shardsink worker"):
            time.sleep(600)  # a worker held in its start, to be stopped there

    def updates(self, interval, worker, workers):
        return pa.table({"key": pa.array([], pa.int64()), "val": pa.array([], pa.string())})
"""


@pytest.fixture
def own_title():
    """``main(["up", ...])`` names this process; give it its name back."""
    title = setproctitle.getproctitle()
    yield
    setproctitle.setproctitle(title)


@pytest.fixture
def no_fork(monkeypatch):
    """Any attempt of this process to start another fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(os, "fork", forbidden)
    monkeypatch.setattr(subprocess.Popen, "_execute_child", forbidden)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        # past the tasks the kernel allows here; elsewhere, past the memory
        (["--groups", "100000"], ["--groups 100000 --workers 4: 500,002 processes"]),
        (
            ["--rows-per-interval", "99999999999999"],
            ["--rows-per-interval 99999999999999: an interval takes at least 2.5 PiB",
             "of memory is available"],
        ),
        (
            ["--workload", "hydrate", "--snapshot-rows", "999999999999"],
            ["--snapshot-rows 999999999999: an interval takes at least", "of memory"],
        ),
    ],
)  # fmt: skip
def test_a_shape_the_machine_has_no_room_for_is_refused_before_any_process(
    tmp_path, capsys, own_title, no_fork, args, words
):
    assert main(["up", "--data-dir", str(tmp_path / "d"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardsink up: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err
    assert not (tmp_path / "d").exists()


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize(
    ("sig", "status", "started"),
    [
        (signal.SIGTERM, 128 + signal.SIGTERM, 20),  # while the groups are being forked
        (signal.SIGTERM, 128 + signal.SIGTERM, CHILDREN),  # waiting for the workers' hellos
        (signal.SIGINT, 130, CHILDREN),
    ],
)
def test_a_stop_during_the_start_leaves_nothing(tmp_path, popen, sig, status, started):
    (tmp_path / "held.py").write_text(textwrap.dedent(HELD))
    shm_before = {p.name for p in SHM_DIR.iterdir() if p.name.startswith(SHM_PREFIX)}
    proc = popen(
        [sys.executable, "-m", "shardsink.cli", "up", "--data-dir", str(tmp_path / "d"),
         "--groups", str(GROUPS), "--workers", str(WORKERS), "--workload",
         f"{tmp_path / 'held.py'}:Held", "--json"],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[psutil.Process] = []

    def enough_started() -> bool:
        assert proc.poll() is None, proc.stderr.read()
        seen[:] = _descendants(proc.pid)
        return len(seen) >= started

    # a look at least every 50 ms: the first case stops it while the groups are forked
    wait_until(enough_started, 200, lambda: f"{started} processes ({len(seen)})", every_s=0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert "while starting: stopped" in err and out == ""  # no summary: nothing ran
    _, alive = psutil.wait_procs(seen, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    shm = {p.name for p in SHM_DIR.iterdir() if p.name.startswith(SHM_PREFIX)} - shm_before
    assert not shm
