"""A cluster's world on emulated hosts: Ray nodes, the consensus server and the
stores, each on its host, every hop between them across the emulated network.

:class:`EmulatedCluster` makes N emulated hosts (:class:`shardsink.netns.Network`:
network namespaces on one bridge, ``10.77.<k>.<i+1>``) and runs everything
inside them; the root namespace stays untouched. Where (a
:class:`~shardsink.config.Placement`, host indices):

- a Ray node on every host, the head on the coordinator's: one CPU, a small
  object store, no dashboard, health checks every 100 ms, bound to its
  host's address, Ray's temp dir its own in the run directory. A coordinator
  started on its host with :meth:`EmulatedCluster.coordinator_flags`
  (``--hosts ray:ADDRESS``) places the cluster's groups on every host;
- the consensus server (``shardsink consensus serve``) on a host of its own,
  an external service for the coordinator, at a fixed port of its host's
  address, so that :meth:`EmulatedCluster.start_consensus` after
  :meth:`EmulatedCluster.kill_consensus` is found where it was; it holds the
  data dir's lock, as a server of a data dir does;
- with ``postgres`` and ``s3``, a throwaway PostgreSQL and S3 server
  (SeaweedFS) on their hosts, listening on the host's address: ``python -m
  shardsink.cli.servers postgres`` and ``s3`` run there (their servers die
  with them). Otherwise the stores are the data dir's, SQLite and ``file://``:
  one file system is every host's, so a ``file://`` blob store is shared.

Secrets stay off command lines: store URIs go to the processes in their
environment, the servers' URLs come back through their logs in the run
directory (the network's scratch directory: 0700, files 0600), and the CURVE keys are the data dir's
``keys/`` (0700, files 0600; the server's and its one client's, made here).

:meth:`EmulatedCluster.close` (also on leaving the ``with`` block, an
exception or Ctrl-C during the start) stops what was started with
:meth:`~EmulatedCluster.popen_on`, the consensus server, the Ray nodes and
the stores, each with a bounded wait, closes the network (which kills
whatever is left in the hosts and deletes them, with their veths, rules and
queues, and the run directory, its scratch directory) and unlinks the
shared-memory segments of the hosts' processes.

If this process dies without closing (SIGKILL), what :meth:`~EmulatedCluster.popen_on`
started gets SIGTERM (``PR_SET_PDEATHSIG``, sent when the thread that started
it exits: start it from the main thread), so a coordinator stops cleanly,
unlinking its segments; the stores' helpers get SIGTERM and stop their
servers. The Ray nodes and the consensus server, which a coordinator's
clean stop needs, and the hosts stay until ``shardsink hosts sweep``
removes them (it removes only runs whose creator is dead).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from .. import datadir
from .._curve import KEYS_ENV, server_keys
from .._pids import process_start
from .._units import MIB
from ..config import Placement
from ..netns import MissingCapability, NetnsError, Network, each, group_members, processes_in
from ..process import SpawnStarter, dies_with_this_process
from ..shm import SegmentName, list_segments, unlink_segment
from ..storage import BLOB_ENV, STORE_ENV
from .postgres import find_bindir
from .ray import FAST_HEALTH_CHECKS
from .s3 import weed_binary

#: The consensus server's port on its host's address: fixed, so a restarted
#: server is where its clients look (nothing else listens on a host's address).
CONSENSUS_PORT = 7000
#: The Ray head's GCS port on its host (Ray's default).
RAY_PORT = 6379
#: Each node's CPUs and object store (Ray's least is 75 MiB; the suite's
#: nodes take 80): three nodes share the machine's 2 cores.
RAY_CPUS, OBJECT_STORE_BYTES = 1, 80 * MIB
#: How long a Ray node has between SIGTERM and SIGKILL: a head ignored SIGTERM
#: for over 10 s (by hand), and nothing of a node's is kept.
RAY_TERM_S = 3.0
#: How long a server asked to stop has (PostgreSQL's fast shutdown, the S3
#: server, the consensus server) before SIGKILL, and what it then has to exit.
SERVER_TERM_S = 10.0
#: How long the whole start may take: three Ray nodes took 8 s here (2 cores).
START_TIMEOUT_S = 120.0
_POLL_S = 0.1
#: What each kind of service prints once it is ready; what follows the
#: match is what it tells (the consensus server's address, the stores' URIs).
_READY = {
    "ray": re.compile(r"Ray runtime started"),
    "consensus": re.compile(r"^listening on ", re.M),
    "postgres": re.compile(r"^(?=postgresql://)", re.M),
    "s3": re.compile(r"^blob URI:\s*", re.M),
}


class EmulationError(NetnsError):
    """A service of the emulated hosts did not start: which, on which host,
    why, and the end of its log."""


class EmulatedHost(msgspec.Struct, frozen=True):
    """One emulated host of a cluster: its index, name (``h0``), namespace,
    address, what it runs (``coordinator``, ``ray head``, ``ray node``,
    ``consensus``, ``postgres``, ``s3``) and the pids of every process in it
    now (Ray's, the servers', and whatever runs there)."""

    index: int
    name: str
    netns: str
    address: str
    roles: tuple[str, ...]
    pids: tuple[int, ...]


@dataclass
class _Service:
    """A process this cluster started on a host, logging to ``log`` from
    byte ``offset`` on (a restarted server appends to its log)."""

    name: str
    host: int
    proc: subprocess.Popen
    log: Path
    offset: int


class EmulatedCluster:
    """``hosts`` emulated hosts running a cluster's world (module doc), its
    stores those of ``data_dir`` (made 0700 if new; ``store``, a
    ``sqlite://`` URI, and ``blob``, a ``file://`` one, instead), or with
    ``postgres`` and ``s3`` a server each on its host. ``place`` says which
    host runs what; ``clocks`` lets ``network.nemesis.clock_skew`` move a
    host's clock (every process started on a host follows it); ``consensus_args`` go to
    ``consensus serve`` (``--retain``, ...), ``consensus_env`` into its
    environment (a chaos run's armed fault points, its history file);
    ``observer``: this process gets a port on the emulated network
    (:attr:`shardsink.netns.Network.observer`), to reach the services
    itself. Started when constructed, within ``timeout_s`` in all.

    Raises ``MissingCapability`` (one line: not root, no ``ip netns``, Ray,
    PostgreSQL, SeaweedFS or libfaketime missing) before making anything,
    ``ValueError`` for a placement outside the hosts, :class:`EmulationError`
    naming the service, its host and its log's end if one does not start
    (everything is then closed)."""

    def __init__(
        self,
        hosts: int,
        *,
        data_dir: str | os.PathLike,
        place: Placement | None = None,
        postgres: bool = False,
        s3: bool = False,
        store: str | None = None,
        blob: str | None = None,
        clocks: bool = False,
        consensus_args: Sequence[str] = (),
        consensus_env: Mapping[str, str] | None = None,
        observer: bool = False,
        run: str = "emu",
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.check(postgres=postgres, s3=s3, clocks=clocks)
        self.place = (place or Placement()).resolve(hosts)
        self.data_dir = datadir.create(data_dir)
        self.store = store or datadir.consensus_uri(self.data_dir)
        self.blob = blob or datadir.blob_uri(self.data_dir)
        self.keys_dir = self.data_dir / "keys"
        server_keys(self.keys_dir)  # the server's, and its one client's (the coordinator's)
        self._consensus_args = tuple(consensus_args)
        self._consensus_env = dict(consensus_env or {})
        self._stores = tuple(name for name, on in (("postgres", postgres), ("s3", s3)) if on)
        self._services: dict[str, _Service] = {}
        self._callers: list[subprocess.Popen] = []
        self._closed = False
        self.network: Network | None = None
        try:
            self.network = Network(hosts, run=run, clocks=clocks, observer=observer)
            # short enough for Ray's socket paths under it; the sweep removes it
            self.run_dir = self.network.scratch
            self._start(postgres, s3, time.monotonic() + timeout_s)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def check(*, postgres: bool = False, s3: bool = False, clocks: bool = False) -> None:
        """Raise ``MissingCapability`` (one line naming what to install) if
        this process cannot run an :class:`EmulatedCluster` of these stores."""
        Network.check(clocks=clocks)
        if importlib.util.find_spec("ray") is None:
            raise MissingCapability("Ray is not installed: pip install 'shardsink[ray]'")
        if postgres and importlib.util.find_spec("psycopg") is None:
            raise MissingCapability("psycopg is not installed: pip install 'shardsink[postgres]'")
        try:
            if postgres:
                find_bindir()
            if s3:
                weed_binary()
        except FileNotFoundError as exc:
            raise MissingCapability(str(exc)) from None

    def __enter__(self) -> EmulatedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what a coordinator needs -------------------------------------------------

    def address(self, host: int) -> str:
        """Host ``host``'s address."""
        return self._net.host(host).address

    @property
    def ray_address(self) -> str:
        """The Ray head's GCS address, ``ADDRESS:PORT`` (``--hosts ray:...``)."""
        return f"{self.address(self.place.coordinator)}:{RAY_PORT}"

    @property
    def coordinator_bind(self) -> str:
        """Where a coordinator on its host listens for its groups (any port)."""
        return f"tcp://{self.address(self.place.coordinator)}:0"

    @property
    def consensus_address(self) -> str:
        """The consensus server's address, the same across its restarts."""
        return f"tcp://{self.address(self.place.consensus)}:{CONSENSUS_PORT}"

    @property
    def blob_shared(self) -> bool:
        """Whether the blob store is a directory (the same on every host)."""
        return self.blob.startswith("file://")

    def coordinator_flags(self) -> list[str]:
        """``shardsink up``'s flags for a coordinator on the coordinator's host:
        the Ray cluster, its bind, the consensus server, the data dir (its
        ``keys/`` holds the client keys) and, for a ``file://`` blob store,
        ``--blob-shared``. The blob URI is in :meth:`coordinator_env`."""
        flags = ["--hosts", f"ray:{self.ray_address}", "--coordinator-bind", self.coordinator_bind]
        flags += ["--consensus", self.consensus_address, "--data-dir", str(self.data_dir)]
        return flags + (["--blob-shared"] if self.blob_shared else [])

    def coordinator_env(self) -> dict[str, str]:
        """What a coordinator's environment adds (to :meth:`popen_on`'s): the
        blob URI, which may hold a secret, and the key directory."""
        return {BLOB_ENV: self.blob, KEYS_ENV: str(self.keys_dir)}

    def environ(self, host: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process on ``host``: this process's, plus
        ``extra``, plus the host's clock (with ``clocks``), for a process
        started by other means than :meth:`popen_on`."""
        return self._net.environ(host, {**os.environ, **(extra or {})})

    def popen_on(
        self,
        host: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        death_signal: int = signal.SIGTERM,
        **kwargs,
    ) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (a coordinator, a reader, ...) in a
        process group of its own, with :meth:`environ` of ``env``; it gets
        ``death_signal`` if the thread that started it exits. ``kwargs`` go
        to ``subprocess.Popen``. Stop it with :meth:`stop`; :meth:`close`
        stops it first if it still runs."""
        proc = self._net.popen(
            host,
            argv,
            env={**os.environ, **(env or {})},
            preexec_fn=dies_with_this_process(death_signal),
            **kwargs,
        )
        self._callers.append(proc)
        return proc

    def starter(self, host: int) -> SpawnStarter:
        """A :class:`~shardsink.process.Starter` of shardsink's children
        (:class:`~shardsink.process.Child`) on ``host``, as :meth:`popen_on`
        starts processes there; each leads a process group of its own
        (``ValueError`` for a launch that joins another's)."""

        def popen(argv: Sequence[str], *, process_group: int, **kwargs) -> subprocess.Popen:
            if process_group:
                raise ValueError("a child on an emulated host leads a process group of its own")
            return self.popen_on(host, argv, **kwargs)

        return SpawnStarter(popen)

    def stop(self, proc: subprocess.Popen, **bounds: float) -> int:
        """Stop a process :meth:`popen_on` started: SIGTERM to its group,
        SIGKILL after ``term_timeout`` (:func:`shardsink.netns.processes.stop`);
        its exit status."""
        if proc in self._callers:
            self._callers.remove(proc)
        return self._net.stop(proc, **bounds)

    # --- the consensus server, and what runs where ---------------------------------

    @property
    def consensus_pid(self) -> int | None:
        """The consensus server's pid while it runs, else ``None``."""
        service = self._services.get("consensus")
        return service.proc.pid if service and service.proc.poll() is None else None

    def kill_consensus(self) -> None:
        """SIGKILL the consensus server, as a crash would, and reap it;
        nothing if it is not running."""
        service = self._services.pop("consensus", None)
        if service is not None:
            _signal_group(service.proc, signal.SIGKILL)  # its group: the server alone
            self._net.stop(service.proc, term_timeout=SERVER_TERM_S)

    def stop_consensus(self) -> None:
        """Stop the consensus server cleanly (SIGTERM, SIGKILL after
        :data:`SERVER_TERM_S`) and reap it; nothing if it is not running."""
        service = self._services.pop("consensus", None)
        if service is not None:
            self._net.stop(service.proc, term_timeout=SERVER_TERM_S)

    def start_consensus(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the consensus server at :attr:`consensus_address` (after
        :meth:`kill_consensus`) and wait until it listens. ``ValueError`` if
        it runs; :class:`EmulationError` if it is not up in ``timeout_s``."""
        if self.consensus_pid is not None:
            raise ValueError(f"the consensus server runs already (pid {self.consensus_pid})")
        dead = self._services.pop("consensus", None)
        if dead is not None:
            self._net.stop(dead.proc)  # reaped
        self._launch_consensus()
        self._ready("consensus", time.monotonic() + timeout_s)

    def hosts(self) -> list[EmulatedHost]:
        """Every host, what it runs and the pids of its processes now."""
        inodes = self._net.inodes()
        found = []
        for host in self._net.hosts:
            pids = processes_in(inodes[host.netns]) if host.netns in inodes else []
            roles = [name for name, i in self._roles() if i == host.index]
            found.append(
                EmulatedHost(
                    host.index, host.name, host.netns, host.address, tuple(roles), tuple(pids)
                )
            )
        return found

    def _roles(self) -> list[tuple[str, int]]:
        place = self.place
        roles = [("coordinator", place.coordinator), ("ray head", place.coordinator)]
        roles += [("ray node", host.index) for host in self._net.hosts]
        roles.append(("consensus", place.consensus))
        return roles + [(name, getattr(place, name)) for name in self._stores]

    # --- start and close -----------------------------------------------------------

    @property
    def _net(self) -> Network:
        if self.network is None or self._closed:
            raise ValueError("this emulated cluster is closed")
        return self.network

    def _start(self, postgres: bool, s3: bool, deadline: float) -> None:
        """Start the stores and the Ray head at once, then the consensus server
        on the stores and the other nodes on the head; wait for all."""
        if postgres:
            subnet = self.address(self.place.postgres).rsplit(".", 1)[0] + ".0/24"
            argv = ["--listen", self.address(self.place.postgres), "--clients", subnet]
            self._helper("postgres", self.place.postgres, [*argv, "--new-user"])
        if s3:
            self._helper("s3", self.place.s3, ["--listen", self.address(self.place.s3)])
        self._launch_ray(self.place.coordinator, head=True)
        if postgres:
            self.store = self._ready("postgres", deadline)
        if s3:
            self.blob = self._ready("s3", deadline)
        self._launch_consensus()
        self._ready(f"ray h{self.place.coordinator}", deadline)
        nodes = [h.index for h in self._net.hosts if h.index != self.place.coordinator]
        for index in nodes:
            self._launch_ray(index, head=False)
        for index in nodes:
            self._ready(f"ray h{index}", deadline)
        self._ready("consensus", deadline)

    def _helper(self, name: str, host: int, args: list[str]) -> None:
        """``python -m shardsink.cli.servers NAME`` on ``host``: a store's
        server, which dies with it; it stops its server (and removes its
        data) when this process dies."""
        argv = [sys.executable, "-m", "shardsink.cli.servers", name, *args]
        argv.append(str(self.run_dir / name))
        self._launch(name, host, argv, env=None, death_signal=signal.SIGTERM)

    def _launch_ray(self, host: int, *, head: bool) -> None:
        address = self.address(host)
        argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block"]
        argv += [f"--num-cpus={RAY_CPUS}", f"--object-store-memory={OBJECT_STORE_BYTES}"]
        argv += [f"--node-ip-address={address}", f"--temp-dir={self.run_dir / f'ray{host}'}"]
        argv += ["--disable-usage-stats", "--include-log-monitor=false", "--log-style=record"]
        if head:
            argv += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
            argv.append(f"--system-config={json.dumps(FAST_HEALTH_CHECKS)}")
        else:
            argv.append(f"--address={self.ray_address}")
        self._launch(f"ray h{host}", host, argv)

    def _launch_consensus(self) -> None:
        argv = [sys.executable, "-m", "shardsink.cli", "consensus", "serve"]
        argv += ["--data-dir", str(self.data_dir), "--bind", self.consensus_address]
        argv += ["--keys", str(self.keys_dir), *self._consensus_args]
        env = {**self._consensus_env, STORE_ENV: self.store, BLOB_ENV: self.blob}
        self._launch("consensus", self.place.consensus, argv, env=env)

    def _launch(
        self,
        name: str,
        host: int,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        death_signal: int | None = None,
    ) -> None:
        """Start service ``name`` on ``host``, its output appended to its log
        (0600) in the run directory; with ``death_signal``, it gets that
        signal when the thread that started it exits."""
        log = self.run_dir / f"{name.replace(' ', '-')}.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        offset = os.fstat(fd).st_size
        try:
            proc = self._net.popen(
                host,
                argv,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                cwd=self.run_dir,
                preexec_fn=death_signal and dies_with_this_process(death_signal),
            )
        finally:
            os.close(fd)
        self._services[name] = _Service(name, host, proc, log, offset)

    def _ready(self, name: str, deadline: float) -> str:
        """What service ``name`` printed after its ready mark, to the end of
        that line; :class:`EmulationError` if it exits first or is silent
        until ``deadline``."""
        service = self._services[name]
        ready = _READY[name.split()[0]]
        where = f"{name} on h{service.host}"
        while True:
            with open(service.log, "rb") as log:
                log.seek(service.offset)
                text = log.read().decode(errors="replace")
            found = ready.search(text)
            if found is not None:
                return text[found.end() :].partition("\n")[0].strip()
            if service.proc.poll() is not None:
                raise EmulationError(f"{where} exited {service.proc.returncode}: {_tail(text)}")
            if time.monotonic() > deadline:
                raise EmulationError(f"{where} was not ready in time: {_tail(text)}")
            time.sleep(_POLL_S)

    def close(self) -> None:
        """Stop everything (module doc) and close the network, every step
        tried whichever fail (the first error raised after). Idempotent."""
        if self._closed:
            return
        network, self._closed = self.network, True
        steps = []
        if network is not None:
            inside = hosts_processes(network)  # before they are stopped
            steps += [
                lambda: each(self._callers[::-1], network.stop),
                lambda: self._stop_services(network, ("consensus",), SERVER_TERM_S),
                lambda: self._stop_services(network, ("ray",), RAY_TERM_S),
                lambda: self._stop_services(network, ("postgres", "s3"), SERVER_TERM_S),
                network.close,
                lambda: each(segments_of(inside), unlink_segment),
            ]
        each(steps, lambda step: step())

    def _stop_services(self, network: Network, kinds: tuple[str, ...], term_s: float) -> None:
        """Stop the services of ``kinds`` together: SIGTERM to each one's
        group at once, SIGKILL to what is left of them ``term_s`` later."""
        names = [name for name in self._services if name.split()[0] in kinds]
        for name in names:
            _signal_group(self._services[name].proc, signal.SIGTERM)
        deadline = time.monotonic() + term_s

        def stop(name: str) -> None:
            left = max(0.0, deadline - time.monotonic())
            network.stop(self._services.pop(name).proc, term_timeout=left)

        each(names, stop)


def hosts_processes(network: Network) -> set[tuple[int, int | None]]:
    """The processes in ``network``'s namespaces now, as (pid, start time)."""
    pids = [pid for inode in network.inodes().values() for pid in processes_in(inode)]
    return {(pid, process_start(pid)) for pid in pids}


def segments_of(processes: set[tuple[int, int | None]]) -> list[SegmentName]:
    """The shared-memory segments ``processes`` (:func:`hosts_processes`)
    made, and every segment of each cluster one of them made any of (its
    members killed earlier made them too)."""
    segments = list_segments()
    clusters = {s.cluster for s in segments if (s.pid, s.start) in processes}
    return [s for s in segments if s.cluster in clusters or (s.pid, s.start) in processes]


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads, unless its leader is
    reaped and it has no member left: then its id may be another's now."""
    if proc.returncode is None or group_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def _tail(text: str, lines: int = 15) -> str:
    """The end of a log, as the error's last lines."""
    return "\n" + "\n".join(text.splitlines()[-lines:]) if text.strip() else "(no output)"
