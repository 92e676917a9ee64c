"""Measuring emulated hosts from the test: probes (``_probe.py``) run inside them."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from shardsink.cli import main
from shardsink.netns import Network

PROBE = Path(__file__).with_name("_probe.py")
PORT = 7007
#: A probe process (no shardsink import) is up in well under a second.
READY_S = 15.0
#: A round trip on a path that works waits this long: a loaded machine is
#: slow, never this slow; a cut path costs BLOCKED_WAIT_S per datagram.
OPEN_WAIT_S = 3.0
BLOCKED_WAIT_S = 0.3


class Ping(msgspec.Struct, frozen=True):
    received: int
    rtt_ms: list[float]


def probe(net: Network, host: str, *args: object, timeout: float = 60.0) -> str:
    """Run the probe ``args`` on ``host`` to completion; its output."""
    return net.exec(host, [sys.executable, "-P", str(PROBE), *map(str, args)], timeout=timeout)


def ping(net: Network, src: str, dst: str, count: int, wait: float = OPEN_WAIT_S) -> Ping:
    """``count`` UDP round trips from ``src`` to the listener on ``dst``."""
    address = net.host(dst).address
    out = probe(net, src, "ping", address, PORT, count, wait, timeout=count * wait + 30)
    return msgspec.json.decode(out, type=Ping)


def reaches(net: Network, src: str, dst: str) -> bool:
    """Whether 3 round trips of 3 from ``src`` to ``dst`` complete (on a cut
    path none can, whatever the load)."""
    received = ping(net, src, dst, 3, wait=OPEN_WAIT_S).received
    assert received in (0, 3), f"{src} -> {dst}: {received} of 3 round trips on a clean path"
    return received == 3


def cut(net: Network, src: str, dst: str) -> bool:
    """Whether no round trip of 3 from ``src`` to ``dst`` completes."""
    return ping(net, src, dst, 3, wait=BLOCKED_WAIT_S).received == 0


def blast(net: Network, src: str, dst: str, count: int) -> None:
    """Send ``count`` datagrams from ``src`` to the listener on ``dst``."""
    probe(net, src, "blast", net.host(dst).address, PORT, count)


class Listener:
    """A UDP listener (echo and counts) on a host, stopped by :meth:`close`."""

    def __init__(self, net: Network, host: str) -> None:
        self.net = net
        argv = [sys.executable, "-P", str(PROBE), "serve", str(PORT)]
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
        self.proc = net.popen(host, argv, **pipes)
        assert self._line() == "ready"

    def counts(self) -> dict[str, int]:
        """Datagrams received so far, by sender address."""
        self.proc.stdin.write("counts\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def settled(self, sender: str, at_least: int = 0) -> int:
        """Datagrams from host ``sender`` once at least ``at_least`` arrived
        and the count stopped moving for 0.3 s (30 s at most)."""
        address = self.net.host(sender).address
        deadline = time.monotonic() + 30
        last = -1
        while time.monotonic() < deadline:
            now = self.counts().get(address, 0)
            if now == last and now >= at_least:
                return now
            last = now
            time.sleep(0.3)  # the quiet span that counts as settled: not a wait for an event
        return last

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()
        self.net.stop(self.proc)

    def _line(self) -> str:
        ready = select.select([self.proc.stdout], [], [], READY_S)[0]
        assert ready, f"the probe on pid {self.proc.pid} said nothing within {READY_S} s"
        return self.proc.stdout.readline().strip()


def listeners(net: Network, *hosts: str) -> dict[str, Listener]:
    return {host: Listener(net, host) for host in hosts}


def hosts_command(argv: list[str]) -> int:
    """Run ``shardsink hosts ...`` as the command line does; its exit status."""
    return main(argv)
