"""``shardsink up --hosts netns:3``: the real coordinator on one emulated
host, the consensus server on another, groups on all three (parts per
append by host), the shard verified, and nothing left after; the same with
PostgreSQL and S3 on their host; a SIGKILLed ``up``'s hosts removed by the
sweep. Each run starts its own three Ray nodes, inside the hosts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardsink.netns.names import NETNS_DIR, netns_names, parse_netns, parse_state_dir
from shardsink.shm import list_segments
from shardsink.testing.emulated import EmulatedCluster
from shardsink.testing.netns import require
from tests.helpers.wait import wait_until
from tests.netns.probes import hosts_command

ROOT = Path(__file__).resolve().parents[2]
#: A small barrier run: one group of two workers a host, so one part per
#: host and append.
SHAPE = ("--groups", "1", "--workers", "2", "--mode", "barrier", "--rows-per-interval", "100")
#: Start (three Ray nodes, the servers, the coordinator placing its agents)
#: and a short run took 21 s here; a loaded machine is slower.
RUN_S = 240


def _up(popen, tmp_path: Path, *args: str) -> subprocess.Popen:
    """``shardsink up --hosts netns:3 --json`` on ``tmp_path/d`` in the
    background, its output piped."""
    require([lambda: EmulatedCluster.check(postgres=True, s3=True)])
    argv = [sys.executable, "-m", "shardsink.cli", "up", "--hosts", "netns:3", "--json"]
    return popen(
        [*argv, "--data-dir", str(tmp_path / "d"), *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _hosts_line(err: str) -> re.Match:
    """The line naming the hosts, what runs where and the consensus server."""
    found = re.search(
        r"emulated hosts (shardsink-up-\d+-\d+-(\d+)) up in [\d.]+s: (.*); consensus at (\S+);",
        err,
    )
    assert found, err
    return found


def _gone(run: str) -> None:
    """Nothing of the run ``run`` (``shardsink-up-...``) is left on the machine:
    no namespace, no state or scratch directory (unless a later run took its
    subnet, and so its scratch directory's name)."""
    name = parse_state_dir(run)
    assert name is not None, run
    assert not [n for n in netns_names() if n.startswith(f"{run}-")]
    assert not name.state_dir.exists()
    later = any(parsed and parsed[0].k == name.k for parsed in map(parse_netns, netns_names()))
    assert later or not name.scratch_dir.exists()


def _by_host(stats: dict) -> dict[str, float]:
    return stats["parts_per_append_by_host"]


def test_up_on_three_emulated_hosts(tmp_path, popen):
    """Groups on every host, the consensus server reached across the
    emulated network, the shard verified, the JSON alone on stdout, and
    nothing of the hosts left."""
    proc = _up(popen, tmp_path, *SHAPE, "--intervals", "5")
    out, err = proc.communicate(timeout=RUN_S)
    assert proc.returncode == 0, err
    stats = json.loads(out)  # the document alone
    assert stats["verified"] is True and stats["appends"] == 5, err
    assert _by_host(stats) == {"0": 1.0, "1": 1.0, "2": 1.0}  # one group on each host
    hosts = _hosts_line(err)
    k = hosts.group(2)
    assert hosts.group(3) == (
        f"h0 10.77.{k}.1 coordinator, ray head, ray node; h1 10.77.{k}.2 ray node, consensus; "
        f"h2 10.77.{k}.3 ray node"
    )
    # the coordinator on h0 used the server on h1, at its emulated address
    assert hosts.group(4) == f"tcp://10.77.{k}.2:7000"
    assert f"consensus at tcp://10.77.{k}.2:7000; stop: Ctrl-C" in err
    _gone(hosts.group(1))  # and no process or segment of it: the leak check


@pytest.mark.slow
def test_up_with_postgresql_and_s3_on_their_host(tmp_path, popen, own_processes):
    """The consensus server on h1 keeps its state in PostgreSQL on h2 and
    the groups write their parts to the S3 server on h2: every hop crosses
    the emulated network."""
    rows = ("--rows-per-interval", "20000")  # Parquet parts on S3, not inline
    args = ("--consensus", "postgresql", "--blob", "s3", *SHAPE, *rows, "--intervals", "4")
    proc = _up(popen, tmp_path, *args)
    argv, deadline = [], time.monotonic() + RUN_S
    while True:  # what every process of the run was started with, as it runs
        argv += own_processes().values()
        try:
            out, err = proc.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            assert time.monotonic() < deadline, "the run did not end in time"
    assert proc.returncode == 0, err
    assert any("consensus serve" in a for a in argv) and any("ray.scripts" in a for a in argv)
    assert not [a for a in argv if "postgresql://" in a or "secret" in a]  # in no argv
    stats = json.loads(out)
    assert stats["verified"] is True and stats["appends"] == 4, err
    assert stats["blob_puts"] == 12 and stats["data_parts_per_append"] == 3.0
    assert set(_by_host(stats)) == {"0", "1", "2"}
    hosts = _hosts_line(err)
    assert hosts.group(3).endswith(f"h2 10.77.{hosts.group(2)}.3 ray node, postgres, s3")
    assert "shardsink-test-secret" not in err + out
    _gone(hosts.group(1))
    assert not (tmp_path / "d" / "blob").exists()  # the blobs went to S3


@pytest.mark.slow
def test_a_sigkilled_up_is_swept(tmp_path, popen, own_processes):
    """``up`` SIGKILLed mid-run: what it started dies with it (the
    coordinator stops cleanly, unlinking its segments), the hosts stay, and
    ``shardsink hosts sweep`` removes them and whatever still runs in them."""
    events = tmp_path / "events.jsonl"
    rows = ("--rows-per-interval", "20000")  # parts through shared memory
    args = (*SHAPE, *rows, "--intervals", "100000", "--pace", "realtime", "--interval-ms", "200")
    proc = _up(popen, tmp_path, *args, "--events", str(events))
    _appended(proc, events, 3)
    run = next(n for n in netns_names() if n.startswith(f"shardsink-up-{proc.pid}-"))
    run = run.rsplit("-", 1)[0]
    ours = set(own_processes())
    assert [s for s in list_segments() if s.pid in ours], "no part went through shared memory"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_until(  # the coordinator's clean stop
        lambda: not [s for s in list_segments() if s.pid in ours],
        60,
        lambda: f"the unlinking of its segments ({list_segments()})",
    )
    assert (NETNS_DIR / f"{run}-h0").exists()  # a dead run's hosts stay until swept

    assert hosts_command(["hosts", "sweep"]) == 0
    _gone(run)
    # killed, reaped by init
    wait_until(lambda: not own_processes(), 30, lambda: f"the end of {own_processes()}")


def _appended(proc: subprocess.Popen, events: Path, count: int) -> None:
    """Wait until the run has appended ``count`` intervals (its events)."""

    def appended() -> bool:
        assert proc.poll() is None, proc.communicate()
        return events.exists() and len(events.read_text().splitlines()) >= count

    wait_until(appended, RUN_S, f"{count} appended intervals")


@pytest.mark.slow
def test_sigterm_stops_the_coordinator_cleanly_and_removes_the_hosts(tmp_path, popen):
    events = tmp_path / "events.jsonl"
    args = (*SHAPE, "--intervals", "100000", "--pace", "realtime", "--interval-ms", "200")
    proc = _up(popen, tmp_path, *args, "--events", str(events))
    _appended(proc, events, 3)
    proc.send_signal(signal.SIGTERM)  # passed on: the coordinator stops as asked to
    out, err = proc.communicate(timeout=RUN_S)
    assert proc.returncode == 0, err
    stats = json.loads(out)
    assert stats["verified"] is True and stats["appends"] >= 3
    assert "SIGTERM: stopping cleanly" in err
    _gone(_hosts_line(err).group(1))


@pytest.mark.slow
def test_ctrl_c_while_the_hosts_start_removes_them(tmp_path, popen):
    proc = _up(popen, tmp_path, *SHAPE, "--intervals", "5")

    def starting() -> list[str]:
        assert proc.poll() is None, proc.communicate()
        return [n for n in netns_names() if n.startswith(f"shardsink-up-{proc.pid}-")]

    # a look at least every 20 ms: the hosts are still starting when it is interrupted
    run = wait_until(starting, RUN_S, "its first emulated host", every_s=0.02)[0]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=RUN_S)
    assert proc.returncode == 130, err
    assert out == "" and "interrupted while the emulated hosts started: stopped" in err
    _gone(run.rsplit("-", 1)[0])
