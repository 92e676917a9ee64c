"""Names of a run's namespaces and hosts, its subnet, whether its creator lives.

A run of emulated hosts is named ``shardsink-<run>-<pid>-<start>-<k>``: the
run id (1-16 of ``A-Za-z0-9``), the creating process's pid and start time
(clock ticks since boot, :func:`shardsink._pids.process_start`) and ``k``,
the third byte of its subnet ``10.77.<k>.0/24``. Its namespaces add a role:
``-sw`` for the switch (the bridge) and ``-h<i>`` for host ``i``; its state
directory (clock files) is ``/run/shardsink-netns/<name>``. The pid and start
time make liveness exact (a recycled pid does not keep a dead run's
leftovers alive), so :mod:`.sweep` removes only dead runs' leftovers.

``k`` is chosen under a lock among the subnets no namespace or state
directory on this machine names, dead or alive, and reserved by creating
the state directory before the lock is let go: concurrent runs never share
a subnet, though each has its own bridge and could.

A run's scratch directory, for the files of what runs in its hosts, is
``/run/shardsink-netns/scratch-<k>``: named by ``k`` alone, so that a Unix
socket's path deep under it still fits (Ray's session directories), which
a run's full name would not. ``k`` is a live run's alone, so a scratch
directory whose ``k`` no live run holds is a dead run's (removed under the
lock, :func:`locked`, by a new run of that ``k`` and by the sweep).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import msgspec

from .._pids import process_start

NETNS_DIR = Path("/run/netns")
STATE_DIR = Path("/run/shardsink-netns")
SUBNETS = 256
_RUN_RE = re.compile(r"[A-Za-z0-9]{1,16}")
_NAME = r"shardsink-([A-Za-z0-9]{1,16})-([1-9][0-9]*)-([0-9]+)-([0-9]{1,3})"
_NAME_RE = re.compile(_NAME)
_NETNS_RE = re.compile(rf"{_NAME}-(sw|h[0-9]{{1,3}})")
_SCRATCH_RE = re.compile(r"scratch-([0-9]{1,3})")


class Host(msgspec.Struct, frozen=True):
    """One emulated host: its short name (``h0``, ...), its index, its network
    namespace and its address in the run's ``/24``."""

    name: str
    index: int
    netns: str
    address: str


class RunName(msgspec.Struct, frozen=True):
    """One run of emulated hosts; ``str()`` is the prefix of its names."""

    run: str
    pid: int
    start: int
    k: int

    def __str__(self) -> str:
        return f"shardsink-{self.run}-{self.pid}-{self.start}-{self.k}"

    def netns(self, role: str) -> str:
        """The name of this run's namespace ``role`` (``sw``, ``h0``, ...)."""
        return f"{self}-{role}"

    @property
    def state_dir(self) -> Path:
        return STATE_DIR / str(self)

    @property
    def scratch_dir(self) -> Path:
        """The run's scratch directory (module doc); made by its user."""
        return STATE_DIR / f"scratch-{self.k}"

    def host(self, index: int) -> Host:
        """Host ``index`` of the run: ``h<index>`` at ``10.77.<k>.<index + 1>``."""
        return Host(f"h{index}", index, self.netns(f"h{index}"), f"10.77.{self.k}.{index + 1}")

    def alive(self) -> bool:
        """Whether the process that created the run is still running."""
        return process_start(self.pid) == self.start


def parse_netns(name: str) -> tuple[RunName, str] | None:
    """The run and role of a namespace name shardsink made; ``None`` for any other."""
    match = _NETNS_RE.fullmatch(name)
    if match is None:
        return None
    run, pid, start, k, role = match.groups()
    return RunName(run, int(pid), int(start), int(k)), role


def parse_state_dir(name: str) -> RunName | None:
    """The run of a state directory's name; ``None`` for any other name."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        return None
    run, pid, start, k = match.groups()
    return RunName(run, int(pid), int(start), int(k))


def netns_names() -> list[str]:
    """Every network namespace name ``ip netns`` knows on this machine."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def parse_scratch(name: str) -> int | None:
    """The ``k`` of a scratch directory's name; ``None`` for any other name."""
    match = _SCRATCH_RE.fullmatch(name)
    return int(match.group(1)) if match else None


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Hold the lock under which subnets are taken and scratch directories
    removed (made with the state directory if missing)."""
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def state_dirs() -> list[str]:
    """The names in the state directory (runs' and anything else)."""
    try:
        return sorted(os.listdir(STATE_DIR))
    except FileNotFoundError:
        return []


def new_run(run: str) -> RunName:
    """Name a new run of this process and reserve its subnet by creating its
    state directory. ``ValueError`` for an invalid run id; ``RuntimeError``
    if every subnet ``10.77.0-255.0/24`` is taken."""
    if not isinstance(run, str) or not _RUN_RE.fullmatch(run):
        raise ValueError(f"invalid run id {run!r}: use 1 to 16 of A-Z a-z 0-9")
    pid = os.getpid()
    start = process_start(pid)
    if start is None:  # only without /proc, where nothing here works
        raise RuntimeError(f"cannot read the start time of this process from /proc/{pid}")
    with locked():  # held for a listing and a mkdir
        taken = {parsed[0].k for parsed in map(parse_netns, netns_names()) if parsed}
        taken |= {parsed.k for parsed in map(parse_state_dir, state_dirs()) if parsed}
        free = [k for k in range(SUBNETS) if k not in taken]
        if not free:
            raise RuntimeError(
                "every subnet 10.77.0-255.0/24 is taken by a run of emulated hosts; "
                "`shardsink hosts sweep` removes dead runs' leftovers"
            )
        name = RunName(run, pid, start, free[0])
        name.state_dir.mkdir(mode=0o700)
        shutil.rmtree(name.scratch_dir, ignore_errors=True)  # a dead run's of this k
    return name
