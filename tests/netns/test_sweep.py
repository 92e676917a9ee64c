"""A run SIGKILLed with hosts, a delay handler and a process in a host is
swept (by the command and the function), and a live run beside it is not;
Ctrl-C in a run's ``with`` block removes it all."""

from __future__ import annotations

import select
import signal
import subprocess
import sys

import pytest

from shardsink._pids import process_start
from shardsink.netns import sweep, tools
from shardsink.netns.names import (
    NETNS_DIR,
    RunName,
    new_run,
    parse_netns,
    parse_state_dir,
    state_dirs,
)
from tests.netns.probes import hosts_command, listeners, reaches

VICTIM = """
import time
from shardsink.netns import Network
with Network(2, run="victim") as net:
    net.nemesis.delay("h1", 5)
    sleeper = net.popen("h0", ["sleep", "300"])
    print(net.name, sleeper.pid, flush=True)
    time.sleep(300)  # to be killed: its network is left for the sweep
"""
NEEDS = [tools.require_iptables, tools.require_netfilterqueue]


def _victim(popen) -> tuple[subprocess.Popen, str, int, list[str]]:
    """A process with a network of 2 hosts, a delay and a process on h0:
    itself, the run's name, the process's pid, the run's namespaces."""
    victim = popen([sys.executable, "-c", VICTIM], stdout=subprocess.PIPE, text=True)
    assert select.select([victim.stdout], [], [], 60)[0], "the victim made no network in 60 s"
    name, sleeper = victim.stdout.readline().split()
    namespaces = [f"{name}-{role}" for role in ("sw", "h0", "h1")]
    assert all((NETNS_DIR / ns).exists() for ns in namespaces)
    return victim, name, int(sleeper), namespaces


def test_sweep_removes_a_killed_runs_leftovers_and_not_a_live_runs(netns_network, popen, capsys):
    live = netns_network(2, needs=NEEDS)
    probes = listeners(live, "h1")
    victim, name, sleeper, leftovers = _victim(popen)
    victim.kill()
    victim.wait(10)
    assert all((NETNS_DIR / ns).exists() for ns in leftovers)
    assert process_start(sleeper) is not None  # its own process group: it outlived the victim

    assert hosts_command(["hosts", "sweep", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f"would remove namespace {ns}\n" in out for ns in leftovers), out
    assert f"would kill process {sleeper}\n" in out
    assert f"would remove state directory {name}\n" in out
    assert str(live.name) not in out
    assert all((NETNS_DIR / ns).exists() for ns in leftovers)  # a dry run removes nothing

    swept = sweep()
    assert set(leftovers) <= set(swept.namespaces) and sleeper in swept.processes
    assert name in swept.directories
    assert not any((NETNS_DIR / ns).exists() for ns in leftovers)
    assert process_start(sleeper) is None
    assert not set(live.namespaces) & set(swept.namespaces)
    assert all((NETNS_DIR / ns).exists() for ns in live.namespaces)
    assert reaches(live, "h0", "h1")  # the live run works on
    probes["h1"].close()


def test_ctrl_c_in_the_with_block_removes_everything(netns_network, popen):
    netns_network(1, needs=NEEDS)  # only the capability checks (and a live run beside)
    victim, name, sleeper, namespaces = _victim(popen)
    victim.send_signal(signal.SIGINT)
    assert victim.wait(30) != 0  # KeyboardInterrupt, after the with block closed the network
    assert not any((NETNS_DIR / ns).exists() for ns in namespaces)
    assert process_start(sleeper) is None
    assert name not in state_dirs()


def test_names_parse_back_and_nothing_else_parses():
    run = RunName("chaos7", 4242, 987654, 3)
    assert parse_netns(run.netns("h12")) == (run, "h12")
    assert parse_netns(run.netns("sw")) == (run, "sw")
    assert parse_state_dir(str(run)) == run
    others = [f"{run}", f"{run}-h0x", f"{run}-br", "shardsink-a-0-1-2-h0", "netns0", f"x{run}-h0"]
    assert [parse_netns(n) for n in others] == [None] * len(others)
    assert run.host(1).address == "10.77.3.2" and run.host(1).netns == run.netns("h1")


@pytest.mark.parametrize("run", ["", "has-dash", "x" * 17, "dot.s"])
def test_a_bad_run_id_is_refused_before_anything_is_made(run):
    before = state_dirs()
    with pytest.raises(ValueError, match="invalid run id"):
        new_run(run)
    assert state_dirs() == before
