"""The observer's port: this process on the emulated network."""

from __future__ import annotations

import socket as sockets

from shardsink.netns import tools
from tests.netns.probes import PORT, Listener


def _echoes(address: str, wait: float) -> bool:
    """Whether a datagram from this process to the probe listener at
    ``address`` comes back within ``wait`` seconds (3 tries)."""
    with sockets.socket(sockets.AF_INET, sockets.SOCK_DGRAM) as udp:
        udp.settimeout(wait)
        for _ in range(3):
            udp.sendto(b"p-observer", (address, PORT))  # the listener echoes "p..."
            try:
                udp.recvfrom(1024)
                return True
            except TimeoutError:
                continue
    return False


def test_the_observers_port_reaches_the_hosts_and_goes_with_the_network(netns_network):
    """With ``observer``, this process reaches a host's service at its
    address (a chaos run's readers and checks); the port is in no fault's
    sides but an isolated host's."""
    net = netns_network(2, observer=True, needs=[tools.require_iptables])
    assert net.observer == f"10.77.{net.name.k}.254"
    listener = Listener(net, "h1")
    try:
        h1 = net.host("h1").address
        assert _echoes(h1, 3.0)
        net.nemesis.partition(["h0"], ["h1"])
        assert _echoes(h1, 3.0)
        fault = net.nemesis.isolate("h1")
        assert not _echoes(h1, 0.3)
        net.nemesis.heal(fault)
        assert _echoes(h1, 3.0)
    finally:
        listener.close()
    # the fixture proves it gone at teardown (no interface left in this namespace)
    assert f"ssk{net.name.k}obs" in {name for _, name in sockets.if_nameindex()}
