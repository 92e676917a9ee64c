"""The figures of docs/chaos.md's "Emulated hosts", measured by hand (root):

    python -m tests.netns.measure

Makes and closes networks of 3 hosts, then measures UDP round trips between
two hosts clean, delayed and jittered, the share a lossy host loses, and
what a clock call costs a process on a host with clocks. Prints one line a
figure; leaves nothing behind (each network is closed).
"""

from __future__ import annotations

import statistics
import sys
import time

from shardsink.netns import Network
from tests.netns.probes import blast, listeners, ping

CLOCK_CALLS = "import time; t=time.perf_counter(); [time.time() for _ in range(100000)]; " \
    "print((time.perf_counter()-t)*10)"  # fmt: skip


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f} (median {statistics.median(values):.3f})"


def lifecycle(repeats: int = 5) -> None:
    made, closed = [], []
    for _ in range(repeats):
        start = time.monotonic()
        net = Network(3, run="measure")
        made.append((time.monotonic() - start) * 1000)
        start = time.monotonic()
        net.close()
        closed.append((time.monotonic() - start) * 1000)
    print(f"network of 3 hosts: made in {_spread(made)} ms, closed in {_spread(closed)} ms")


def paths() -> None:
    with Network(2, run="measure") as net:
        probes = listeners(net, "h1")
        print(f"round trip h0 -> h1, 100 of them: {_spread(ping(net, 'h0', 'h1', 100).rtt_ms)} ms")
        for ms, jitter in ((50, 0), (40, 10)):
            fault = net.nemesis.delay("h1", ms, jitter)
            rtts = ping(net, "h0", "h1", 20).rtt_ms
            print(f"delay {ms} ms +- {jitter}: round trips (20) {_spread(rtts)} ms")
            net.nemesis.heal(fault)
        for p in (0.05, 0.2):
            before = probes["h1"].settled("h0")  # the round trips' datagrams count too
            fault = net.nemesis.loss("h1", p)
            blast(net, "h0", "h1", 4000)
            received = probes["h1"].settled("h0", at_least=before + 1) - before
            print(f"loss {p}: {4000 - received} of 4000 lost")
            net.nemesis.heal(fault)
        probes["h1"].close()


def clock_cost() -> None:
    for clocks in (False, True):
        with Network(1, run="measure", clocks=clocks) as net:
            cost = float(net.exec("h0", [sys.executable, "-c", CLOCK_CALLS]))
            print(f"time.time() on a host {'with' if clocks else 'without'} clocks: {cost:.2f} us")


if __name__ == "__main__":
    print(f"python {sys.version.split()[0]}")
    lifecycle()
    paths()
    clock_cost()
