"""Emulated hosts: network namespaces on one bridge, made and removed by a run.

A :class:`Network` of N hosts is N network namespaces (``h0``...), each with
loopback up and one interface ``eth0`` at ``10.77.<k>.<i+1>/24``, the other
end of whose veth is a port of the bridge ``br0`` in a namespace of its own,
the switch. Nothing is made in the root namespace: its interfaces and
firewall never see the run's traffic (with ``br_netfilter`` loaded, a bridge
there would pass its frames through the root's iptables), but for the
*observer's port* when asked (``observer=True``): one veth from the root
namespace to the bridge at ``10.77.<k>.254`` (:attr:`Network.observer`), so
this process (a chaos run's readers and checks, as Jepsen's control node)
reaches the hosts' services over the emulated network. It is in no fault's
sides: a partition leaves it connected to both, an isolated host drops it
too. Deleting the switch namespace deletes it, root end and all.

Commands run in a host through ``ip netns exec`` (:meth:`Network.exec`,
:meth:`Network.popen`); faults are injected through :attr:`Network.nemesis`
(:mod:`.nemesis`). :meth:`Network.close` (also on leaving the ``with``
block, on an exception or Ctrl-C) heals every fault, stops every process
started in the hosts and removes the namespaces and the state directory; a
run whose creator died without closing is removed by :func:`.sweep.sweep`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import tools
from .clock import Clocks
from .names import NETNS_DIR, Host, RunName, new_run
from .nemesis import HostRef, Nemesis
from .processes import popen_in, stop as stop_process
from .sweep import remove_namespaces

#: Hosts in one /24 (.1 to .253; .254 is the observer's port).
MAX_HOSTS = 253


class Network:
    """``hosts`` emulated hosts (1 to 253) of the run ``run`` (1-16 of
    ``A-Za-z0-9``); with ``clocks``, every process started on a host follows
    that host's wall clock, which :meth:`Nemesis.clock_skew` moves.

    Raises ``MissingCapability`` (not root, no ``ip netns``, no libfaketime
    with ``clocks``) before making anything, ``ValueError`` for a bad count
    or run id, ``CommandFailed`` if ``ip`` fails (what was made is removed).
    """

    def __init__(
        self, hosts: int, *, run: str = "net", clocks: bool = False, observer: bool = False
    ) -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts={hosts}: a network has 1 to {MAX_HOSTS} hosts")
        self.check(clocks=clocks)
        self.name: RunName = new_run(run)
        self.hosts: tuple[Host, ...] = tuple(self.name.host(i) for i in range(hosts))
        self.switch = self.name.netns("sw")
        #: this process's address on the network (the observer's port), if asked
        self.observer = f"10.77.{self.name.k}.254" if observer else None
        self._started: list[subprocess.Popen] = []
        self._closed = False
        self.clocks: Clocks | None = None
        self.nemesis = Nemesis(self)
        try:
            if clocks:
                self.clocks = Clocks(
                    self.name.state_dir, [h.name for h in self.hosts], str(self.name)
                )
            self._make()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def check(*, clocks: bool = False, observer: bool = False) -> None:
        """Raise ``MissingCapability`` if this process cannot make a network
        (not root, no ``ip netns``; no libfaketime with ``clocks``); an
        ``observer``'s port needs nothing more."""
        tools.require_ip_netns()
        if clocks:
            tools.libfaketime()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def namespaces(self) -> tuple[str, ...]:
        """The run's namespace names: the switch, then the hosts."""
        return (self.switch, *(h.netns for h in self.hosts))

    @property
    def scratch(self) -> Path:
        """The run's scratch directory (mode 0700, made on first use), for
        the files of what runs in its hosts; a Unix socket's path up to 70
        bytes below it fits. :meth:`close` removes it, as the sweep does a
        dead run's. ``ValueError`` once closed."""
        if self._closed:
            raise ValueError(f"{self.name} is closed")
        with contextlib.suppress(FileExistsError):
            self.name.scratch_dir.mkdir(mode=0o700)
        return self.name.scratch_dir

    @property
    def started(self) -> tuple[subprocess.Popen, ...]:
        """The processes :meth:`popen` started and :meth:`stop` has not stopped."""
        return tuple(self._started)

    def host(self, ref: HostRef) -> Host:
        """Host ``ref``: a :class:`Host` of this network, its name (``h0``) or
        index. ``ValueError`` for anything else."""
        for host in self.hosts:
            if ref in (host, host.name) or (type(ref) is int and ref == host.index):
                return host
        raise ValueError(f"no host {ref!r} in {self.name} (hosts h0 to h{len(self.hosts) - 1})")

    def environ(self, host: HostRef, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process on ``host``: ``base`` (this process's if
        ``None``), plus the host's clock with ``clocks``. For processes the
        caller starts by other means (``ip netns exec`` of its own)."""
        env = dict(os.environ if base is None else base)
        return env if self.clocks is None else self.clocks.environ(self.host(host).name, env)

    def exec(
        self, host: HostRef, argv: Sequence[str], *, input: str | None = None, timeout: float = 10.0
    ) -> str:
        """Run ``argv`` on ``host`` to completion, with :meth:`environ`; its
        output. ``CommandFailed`` if it exits non-zero or outlives ``timeout``
        seconds (it is killed)."""
        command = ["ip", "netns", "exec", self.host(host).netns, *argv]
        return tools.run(command, input=input, timeout=timeout, env=self.environ(host))

    def popen(
        self, host: HostRef, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs
    ) -> subprocess.Popen:
        """Start ``argv`` on ``host`` in a process group of its own, with
        :meth:`environ` of ``env``; ``kwargs`` go to ``subprocess.Popen``.
        Stop it with :meth:`stop`; :meth:`close` stops whatever is left."""
        if self._closed:
            raise ValueError(f"{self.name} is closed")
        proc = popen_in(self.host(host).netns, argv, env=self.environ(host, env), **kwargs)
        self._started.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, **bounds: float) -> int:
        """Stop a process :meth:`popen` started (SIGTERM to its group, SIGKILL
        after ``term_timeout``, reaped; see :func:`.processes.stop`); its
        exit status."""
        status = stop_process(proc, **bounds)
        if proc in self._started:
            self._started.remove(proc)
        return status

    def close(self) -> None:
        """Heal every fault, stop every process started in the hosts, kill any
        other process in them, delete the namespaces and the state directory.
        Idempotent; every step is tried, and the first error raised after."""
        self._closed = True
        steps = [
            self.nemesis.heal_all,
            lambda: tools.each(self._started[::-1], self.stop),
            # at once: the switch's deletion takes its veths with it, a moment later
            *([self._remove_observer] if self.observer is not None else []),
            lambda: remove_namespaces(self.namespaces),
            *([self.clocks.close] if self.clocks is not None else []),
            lambda: shutil.rmtree(self.name.state_dir, ignore_errors=True),
            lambda: shutil.rmtree(self.name.scratch_dir, ignore_errors=True),
        ]
        tools.each(steps, lambda step: step())

    def _make(self) -> None:
        tools.run(["ip", "-batch", "-"], input="".join(f"netns add {n}\n" for n in self.namespaces))
        switch = ["link add br0 type bridge", "link set br0 up"]
        for h in self.hosts:
            switch.append(f"link add h{h.index} type veth peer name eth0 netns {h.netns}")
            switch.append(f"link set h{h.index} master br0 up")
        tools.run(["ip", "-n", self.switch, "-batch", "-"], input="\n".join(switch) + "\n")
        for h in self.hosts:
            lines = ["link set lo up", f"addr add {h.address}/24 dev eth0", "link set eth0 up"]
            tools.run(["ip", "-n", h.netns, "-batch", "-"], input="\n".join(lines) + "\n")
        if self.observer is not None:
            port = f"ssk{self.name.k}obs"  # in the root namespace: 15 bytes at most, unique by k
            tools.run(["ip", "-n", self.switch, "link", "add", "obs", "type", "veth", "peer",
                       "name", port, "netns", "1"])  # fmt: skip
            tools.run(["ip", "-n", self.switch, "link", "set", "obs", "master", "br0", "up"])
            tools.run(["ip", "addr", "add", f"{self.observer}/24", "dev", port])
            tools.run(["ip", "link", "set", port, "up"])

    def _remove_observer(self) -> None:
        port = f"ssk{self.name.k}obs"
        if port in {name for _, name in socket.if_nameindex()}:
            tools.run(["ip", "link", "del", port])

    def inodes(self) -> dict[str, int]:
        """The namespace inode of each of the run's namespaces that exists
        (what ``/proc/<pid>/ns/net`` of a process in it names)."""
        found = {}
        for name in self.namespaces:
            try:
                found[name] = os.stat(NETNS_DIR / name).st_ino
            except FileNotFoundError:
                continue
        return found
