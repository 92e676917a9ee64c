"""``shardsink chaos --hosts netns:3``: a run between emulated hosts under
network faults (partitions, loss, delay, clock skew) beside process kills,
its history checked for linearizability; and a SIGKILLed run's hosts
removed by ``shardsink hosts sweep``. Each run starts its own Ray nodes,
consensus server and hosts, and nothing of them is left after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardsink.chaos import ChaosConfig, run_chaos
from shardsink.chaos.schedule import NETWORK_KINDS, firings, schedule
from shardsink.netns.names import NETNS_DIR, netns_names
from shardsink.testing.emulated import EmulatedCluster
from shardsink.testing.netns import require
from tests.helpers.wait import wait_until
from tests.netns.probes import hosts_command

ROOT = Path(__file__).resolve().parents[2]


def _needs() -> None:
    require([lambda: EmulatedCluster.check(clocks=True)])


def _run_names(pid: int) -> set[str]:
    """The runs (``shardsink-chaos-PID-...``) of emulated hosts process ``pid`` made."""
    return {n.rsplit("-", 1)[0] for n in netns_names() if n.startswith(f"shardsink-chaos-{pid}-")}


def test_a_short_run_between_emulated_hosts_loses_nothing(tmp_path) -> None:
    """Three hosts, a coordinator on h0, the consensus server on h1: the
    network faults one at a time (each healed), hosts and the consensus
    server killed between them. The run's checks (the shard exact, every
    blob there, nothing left) and its history's hold: valid."""
    _needs()
    faults = ("partition-host", "partition-store", "loss", "delay", "clock-skew", "kill-consensus")
    config = ChaosConfig(
        duration_s=45,
        seed=2,
        data_dir=str(tmp_path / "run"),
        hosts="netns:3",
        groups=1,
        workers=2,
        faults=faults,
        mean_gap_s=2.0,
        network_max_s=6.0,
    )
    before = set(netns_names())
    report = run_chaos(config)
    assert report.violations == [], report.violations
    assert report.verdict == "valid", report.reasons
    assert report.history.verdict == "valid" and report.history.appends >= 5, report.history
    events = schedule(
        config.seed, config.duration_s, config.faults, mode=config.mode,
        mean_gap_s=config.mean_gap_s, pause_max_s=config.pause_max_s, hosts=True,
        network=True, network_max_s=config.network_max_s,
    )  # fmt: skip
    scheduled = firings(events)
    fired = {k: n for k, n in report.injected.items() if k in NETWORK_KINDS}
    assert fired == {k: n for k, n in scheduled.items() if k in NETWORK_KINDS}
    assert len(fired) >= 3, fired  # several kinds, each healed
    assert len(report.heals) == sum(fired.values())
    assert all(h["healed_s"] > h["start_s"] for h in report.heals)
    assert report.snapshots_checked > 0 and report.segments_swept == 0
    assert set(netns_names()) == before  # the hosts are gone with the run


@pytest.mark.slow
def test_a_sigkilled_run_is_swept(tmp_path, popen, own_processes) -> None:
    """``chaos`` SIGKILLed mid-run: its coordinator stops (it gets SIGTERM
    when its parent dies), the hosts stay until ``shardsink hosts sweep``
    removes them with whatever runs in them (the Ray nodes, the consensus
    server): then no namespace, process or segment of the run is left."""
    _needs()
    argv = [sys.executable, "-m", "shardsink.cli", "chaos", "--hosts", "netns:3"]
    argv += ["--duration-s", "600", "--faults", "loss,delay", "--groups", "1", "--workers", "2"]
    proc = popen(
        [*argv, "--data-dir", str(tmp_path / "run")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    appended = tmp_path / "run" / "appended.jsonl"

    def three_appended() -> bool:
        assert proc.poll() is None, proc.communicate()
        return appended.exists() and len(appended.read_text().splitlines()) >= 3

    wait_until(three_appended, 240, "3 appended intervals")
    (run,) = _run_names(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert (NETNS_DIR / f"{run}-h0").exists()  # a dead run's hosts stay until swept
    assert hosts_command(["hosts", "sweep"]) == 0
    assert not _run_names(proc.pid)
    # killed by the sweep, reaped by init
    wait_until(lambda: not own_processes(), 60, lambda: f"the end of {own_processes()}")
    report = tmp_path / "run" / "history.jsonl"
    assert report.exists() and json.loads(report.read_text().splitlines()[0])["kind"]
