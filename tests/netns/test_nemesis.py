"""Emulated hosts reach each other, and each network fault does what it says
and heals, measured from inside the hosts (UDP round trips and counts, a TCP
exchange, the clock a process reads). Every network is proven gone after.
"""

from __future__ import annotations

import os
import select
import signal
import statistics
import subprocess
import sys
import time

import msgspec
import pytest

from shardsink.netns import Fault, delay, tools
from shardsink.netns.processes import processes_in
from tests.netns.probes import PORT, PROBE, blast, cut, listeners, ping, probe, reaches

IPTABLES = [tools.require_iptables]


def test_hosts_have_their_addresses_and_reach_each_other_over_udp_and_tcp(netns_network):
    net = netns_network(3)
    assert [h.address for h in net.hosts] == [f"10.77.{net.name.k}.{i}" for i in (1, 2, 3)]
    assert f"inet {net.hosts[1].address}/24" in net.exec("h1", ["ip", "-o", "addr", "show", "eth0"])
    probes = listeners(net, "h0", "h1", "h2")
    assert all(reaches(net, a, b) for a in probes for b in probes if a != b)
    server = net.popen("h2", [sys.executable, "-P", str(PROBE), "tcp-serve", str(PORT)],
                       stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert server.stdout.readline().strip() == "ready"
    assert probe(net, "h0", "tcp", net.hosts[2].address, PORT).strip() == "HELLO OVER TCP"
    assert server.wait(10) == 0  # it answered and exited
    net.stop(server)
    for listener in probes.values():
        listener.close()


def test_partition_cuts_both_ways_and_heals(netns_network):
    net = netns_network(3, needs=IPTABLES)
    probes = listeners(net, "h0", "h1", "h2")
    fault = net.nemesis.partition(["h0"], ["h1"])
    assert (fault.kind, fault.hosts, fault.peers) == ("partition", ("h0",), ("h1",))
    assert msgspec.json.decode(msgspec.json.encode(fault), type=Fault) == fault  # loggable
    assert cut(net, "h0", "h1") and cut(net, "h1", "h0")
    assert reaches(net, "h2", "h0") and reaches(net, "h2", "h1")  # a third host still reaches
    net.nemesis.heal(fault)
    assert net.nemesis.active == ()
    assert reaches(net, "h0", "h1") and reaches(net, "h1", "h0")
    for listener in probes.values():
        listener.close()


def test_one_way_partition_loses_one_direction_only(netns_network):
    net = netns_network(3, needs=IPTABLES)
    probes = listeners(net, "h0", "h1", "h2")
    fault = net.nemesis.partition_one_way("h0", "h1")
    assert (fault.kind, fault.hosts, fault.peers) == ("partition_one_way", ("h0",), ("h1",))
    blast(net, "h0", "h1", 100)
    blast(net, "h1", "h0", 100)
    assert probes["h0"].settled("h1", at_least=100) == 100  # h1 -> h0 arrives
    assert reaches(net, "h2", "h1")  # after the blast: h1 had it all by now
    assert probes["h1"].settled("h0") == 0  # h0 -> h1 is lost
    net.nemesis.heal(fault)
    blast(net, "h0", "h1", 100)
    assert probes["h1"].settled("h0", at_least=100) == 100
    for listener in probes.values():
        listener.close()


def test_isolate_cuts_a_host_from_every_other(netns_network):
    net = netns_network(3, needs=IPTABLES)
    probes = listeners(net, "h0", "h1", "h2")
    fault = net.nemesis.isolate("h1")
    assert (fault.kind, fault.hosts, fault.peers) == ("isolate", ("h1",), ("h0", "h2"))
    assert all(cut(net, a, b) for a, b in [("h0", "h1"), ("h1", "h0"), ("h2", "h1"), ("h1", "h2")])
    assert reaches(net, "h0", "h2")
    net.nemesis.heal(fault)
    assert reaches(net, "h0", "h1") and reaches(net, "h1", "h2")
    for listener in probes.values():
        listener.close()


def test_loss_drops_about_the_probability_and_heals(netns_network):
    net = netns_network(2, needs=IPTABLES)
    probes = listeners(net, "h1")
    sent, p = 2000, 0.2
    fault = net.nemesis.loss("h1", p)
    assert fault.params == {"probability": p}
    blast(net, "h0", "h1", sent)
    lost = sent - probes["h1"].settled("h0", at_least=1)
    # binomial: sd = sqrt(2000 * 0.2 * 0.8) = 17.9 datagrams; 5 sd either side
    assert abs(lost - sent * p) < 5 * (sent * p * (1 - p)) ** 0.5, f"lost {lost} of {sent}"
    net.nemesis.heal(fault)
    blast(net, "h0", "h1", sent)
    assert probes["h1"].settled("h0", at_least=2 * sent - lost) == 2 * sent - lost  # none lost
    probes["h1"].close()


def test_delay_holds_every_packet_and_heals(netns_network):
    net = netns_network(2, needs=[*IPTABLES, tools.require_netfilterqueue])
    probes = listeners(net, "h1")
    fault = net.nemesis.delay("h1", 50)
    assert fault.params == {"ms": 50, "jitter_ms": 0.0}
    rtts = ping(net, "h0", "h1", 10).rtt_ms
    assert len(rtts) == 10 and min(rtts) >= 50, rtts
    with pytest.raises(ValueError, match="delayed already"):
        net.nemesis.delay("h1", 10)
    net.nemesis.heal(fault)
    assert _holders(net, "h1") == []  # stopped cleanly
    assert net.exec("h1", ["cat", "/proc/net/netfilter/nfnetlink_queue"]).strip() == ""
    assert statistics.median(ping(net, "h0", "h1", 10).rtt_ms) < 25

    jittered = net.nemesis.delay("h1", 40, jitter_ms=10)
    rtts = ping(net, "h0", "h1", 20).rtt_ms
    # each packet is held 30-50 ms; half the draws are under 40 (all 20 over: 1e-6)
    assert min(rtts) >= 30 and min(rtts) < 40, rtts
    net.nemesis.heal(jittered)
    probes["h1"].close()


def test_the_delay_handler_takes_only_a_holding():
    """Its settings are one JSON Holding, decoded strictly: an unknown field
    or a value of another type stops it before it binds (no root needed),
    its last line naming the field."""
    for bad, named in [
        ({"queue": 1, "delay_ms": 5, "hold_ms": 5}, "unknown field `hold_ms`"),
        ({"queue": "1", "delay_ms": 5}, "`$.queue`"),
    ]:
        done = subprocess.run(
            [sys.executable, "-P", str(delay.HANDLER), msgspec.json.encode(bad).decode()],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode != 0 and "ready" not in done.stdout
        assert named in done.stderr.strip().splitlines()[-1], done.stderr


def test_a_dead_delay_handler_lets_packets_through(netns_network):
    net = netns_network(2, needs=[*IPTABLES, tools.require_netfilterqueue])
    probes = listeners(net, "h1")
    fault = net.nemesis.delay("h1", 200)
    (holder,) = _holders(net, "h1")
    pidfd = os.pidfd_open(holder)  # readable once it has died (the ping below is the check)
    try:
        os.kill(holder, signal.SIGKILL)  # started by this test's network, just found in h1
        select.select([pidfd], [], [], 10)
    finally:
        os.close(pidfd)
    rtts = ping(net, "h0", "h1", 5).rtt_ms  # --queue-bypass: no handler, no queue
    assert len(rtts) == 5 and max(rtts) < 200, rtts
    net.nemesis.heal(fault)
    probes["h1"].close()


def test_clock_skew_moves_a_hosts_wall_clock_at_run_time(netns_network):
    net = netns_network(2, needs=IPTABLES, clocks=True)
    reader = net.popen("h0", [sys.executable, "-P", str(PROBE), "clock"],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert _read(reader) == "ready"

    def skew() -> float:  # the running reader's clock against ours
        reader.stdin.write("now\n")
        reader.stdin.flush()
        return float(_read(reader)) - time.time()

    assert abs(skew()) < 2
    fault = net.nemesis.clock_skew("h0", 3600)
    assert fault.params == {"seconds": 3600}
    assert abs(skew() - 3600) < 2
    assert abs(int(net.exec("h0", ["date", "+%s"])) - time.time() - 3600) < 3
    assert abs(int(net.exec("h1", ["date", "+%s"])) - time.time()) < 3  # h1 is not skewed
    bumped = net.nemesis.clock_skew("h0", -7200)  # the same running process, bumped
    assert abs(skew() + 7200) < 2
    assert net.nemesis.active == (bumped,)  # the bump replaced the first skew
    net.nemesis.heal(bumped)
    assert abs(skew()) < 2
    reader.stdin.close()
    assert reader.wait(10) == 0
    net.stop(reader)


def _holders(net, host: str) -> list[int]:
    """The delay handlers running in ``host``."""
    inode = net.inodes()[net.host(host).netns]
    return [pid for pid in processes_in(inode) if b"_delay_handler" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def _read(proc: subprocess.Popen) -> str:
    assert select.select([proc.stdout], [], [], 15)[0], "the clock probe said nothing in 15 s"
    return proc.stdout.readline().strip()
