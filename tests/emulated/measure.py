"""The figures of docs/operating.md's "Emulated hosts", measured by hand (root):

    python -m tests.emulated.measure [REPEATS]

Starts and closes an :class:`EmulatedCluster` of 3 hosts REPEATS times (2 by
default), then once with PostgreSQL and S3, and prints for each: how long
the start and the close took, and the memory of each host's processes once
started (their proportional set size, PSS, which counts a shared page once
in all) with the fall of the kernel's MemAvailable; then the wall time of
``shardsink up --hosts netns:3`` for 5 intervals, start to exit. Leaves
nothing behind (each cluster is closed).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

import psutil

from shardsink._units import MIB
from shardsink.testing.emulated import EmulatedCluster


def _pss(pids: tuple[int, ...]) -> int:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except psutil.Error:  # gone meanwhile
            continue
    return total


def cluster(**stores: bool) -> None:
    """Start, weigh and close one cluster of 3 hosts; print one line."""
    available = psutil.virtual_memory().available
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as data, EmulatedCluster(3, data_dir=data, **stores) as c:
        started = time.monotonic() - began
        hosts = c.hosts()
        fell = available - psutil.virtual_memory().available
        weights = ", ".join(
            f"{h.name} ({', '.join(h.roles)}) {_pss(h.pids) / MIB:.0f} MiB" for h in hosts
        )
        closing = time.monotonic()
    closed = time.monotonic() - closing
    what = " with PostgreSQL and S3" if stores else ""
    print(
        f"3 hosts{what}: started in {started:.1f} s, closed in {closed:.1f} s; PSS {weights}; "
        f"MemAvailable fell {fell / MIB:.0f} MiB",
        flush=True,
    )


def up() -> None:
    """``shardsink up --hosts netns:3``, 5 intervals of a 1x2 barrier, timed."""
    with tempfile.TemporaryDirectory() as data:
        argv = [sys.executable, "-m", "shardsink.cli", "up", "--hosts", "netns:3", "--json"]
        argv += ["--groups", "1", "--workers", "2", "--mode", "barrier", "--intervals", "5"]
        began = time.monotonic()
        subprocess.run([*argv, "--data-dir", data], check=True, capture_output=True, timeout=300)
        print(f"up --hosts netns:3, 5 intervals: {time.monotonic() - began:.1f} s", flush=True)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    for _ in range(repeats):
        cluster()
    cluster(postgres=True, s3=True)
    up()


if __name__ == "__main__":
    main()
