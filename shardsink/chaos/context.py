"""The state the threads of one chaos run share, and small helpers over it."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import uuid
from collections import Counter
from pathlib import Path

from .. import faults
from .._curve import KEYS_ENV
from .._pids import process_start
from ..cluster import Supervision
from ..config import ClusterConfig
from ..connect import open_shard
from ..persist import Shard, ShardConfig
from ..process import RUN_MARK, Child, marked
from ..server import HISTORY_ENV, PROCESS_ENV
from ..storage import BLOB_ENV, STORE_ENV
from .config import ChaosConfig
from .nemesis import cluster_processes

log = logging.getLogger(__name__)


def fault_dir_of(work: Path) -> Path:
    """The fault directory of a run in ``work``: the one given to the command
    (``--fault-dir``, ``SHARDSINK_FAULT_DIR``), else ``work/faults``. Every
    process of the run, each coordinator started again included, arms with
    it, so its point budgets are the run's."""
    given = os.environ.get(faults.ENV_DIR)
    return Path(given) if given else work / "faults"


class RunContext:
    """What the threads of one run share: its directories and stores, the
    address clients reach the consensus process at, the violations and counts
    (thread-safe), the coordinator child, and every process of the cluster
    seen so far (kept by the main thread)."""

    def __init__(self, config: ChaosConfig, work: Path) -> None:
        self.config = config
        #: the run's shards: the workload's, or :data:`~.config.SHARD`
        self.shard_names = tuple(config.shard_schemas())
        self.work = work
        self.data = work / "data"
        self.logs = work / "logs"
        self.fault_dir = fault_dir_of(work)
        self.events_path = work / "appended.jsonl"
        self.appended = AppendLog(self.events_path)
        # ipc paths are short-lived and length-limited: a 0700 directory in /tmp
        self.sock_dir = Path(tempfile.mkdtemp(prefix="shardsink-chaos-"))
        #: where clients reach the consensus process (emulated hosts': a
        #: server of theirs, :meth:`use_hosts`)
        self.bind = f"ipc://{self.sock_dir / 'consensus'}"
        self.mark = f"{os.getpid()}.{uuid.uuid4().hex[:12]}"
        #: every client operation of the consensus protocol the run's
        #: processes make (:mod:`shardsink.server.history`)
        self.history_path = work / "history.jsonl"
        #: the CURVE keys of a ``tcp://`` consensus server's clients
        self.keys: Path | None = None
        postgres, s3 = config.emulated_stores
        self.cluster = ClusterConfig(  # emulated hosts' own stores: once they run
            data_dir=str(self.data),
            blob=None if s3 else config.blob,
            consensus=None if postgres else config.consensus,
            consensus_bind=self.bind,
        )
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.coordinator: Child | None = None
        # every process of the cluster seen so far: pid -> (start, name), the
        # start as ``sweep.process_start`` gives it (a reused pid is a new entry)
        self.seen: dict[int, tuple[int, str]] = {}
        self.counts: Counter[str] = Counter()

    def use_hosts(self, hosts) -> None:
        """Point the run at the stores and the consensus server of its
        emulated ``hosts`` (a :class:`~.emulation.RunHosts`)."""
        self.bind = hosts.consensus_address
        self.keys = hosts.keys_dir
        self.cluster = ClusterConfig(
            data_dir=str(self.data), blob=hosts.blob, consensus=hosts.store
        )

    def violation(self, what: str) -> None:
        with self.lock:
            if what not in self.violations:
                log.error("violation: %s", what)
                self.violations.append(what)

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def coordinator_pid(self) -> int | None:
        child = self.coordinator
        return child.pid if child is not None and child.returncode is None else None

    def note_processes(self) -> None:
        pid = self.coordinator_pid()
        if pid is None:
            return
        for target in cluster_processes(pid, self.mark if self.config.on_hosts else ""):
            self.note(target.pid, f"{target.kind} {target.name}")

    def note(self, pid: int, name: str) -> None:
        start = process_start(pid)
        if start is not None and self.seen.get(pid, (None,))[0] != start:
            self.seen[pid] = (start, name)

    def env(self, *, maintenance: bool = False) -> dict[str, str]:
        """The run's mark, for the environment of the processes it starts
        (those of maintenance apart: they may outlive a coordinator), and the
        store URIs, which there, unlike on a command line, show in no ``ps``."""
        env = {
            RUN_MARK: self.mark + ("/maintenance" if maintenance else ""),
            STORE_ENV: self.cluster.consensus_uri,
            BLOB_ENV: self.cluster.blob_uri,
        }
        return env | ({KEYS_ENV: str(self.keys)} if self.keys is not None else {})

    def history_env(self, process: str) -> dict[str, str]:
        """The environment that has a process record its client operations
        in the run's history, under the name ``process``."""
        return {HISTORY_ENV: str(self.history_path), PROCESS_ENV: process}

    def client_env(self) -> dict[str, str]:
        """What this process's own clients (the readers) read from its
        environment while the run lasts: the history, CURVE keys."""
        env = self.history_env(f"readers (pid {os.getpid()})")
        return env | ({KEYS_ENV: str(self.keys)} if self.keys is not None else {})

    @staticmethod
    def server_env(env: dict[str, str]) -> dict[str, str]:
        """``env`` (:meth:`env` and the armed points) for a consensus server
        of emulated hosts: unmarked, since it outlives coordinators (the
        nemesis finds it by pid)."""
        return {name: value for name, value in env.items() if name != RUN_MARK}

    def left_running(self, *, maintenance: bool = False) -> dict[int, str]:
        """Processes of the run still running, found by their mark, so a
        descendant orphaned between two looks at the tree is found too."""
        left = marked(RUN_MARK, self.mark)
        if maintenance:
            left.update(marked(RUN_MARK, self.mark + "/maintenance"))
        return left

    def shard_config(self) -> ShardConfig:
        return ShardConfig(server_timeout_s=2.0, server_retry_for_s=10.0)


class AppendLog:
    """Follows the coordinators' ``--events`` file: intervals appended, how
    many of them by an attempt after the first, and each coordinator's last
    supervision counts (also from the lines written between appends) and
    group restart times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.count = 0
        self.redone = 0
        self.supervision: dict[int, dict[str, int]] = {}
        self.restart_s: dict[int, list[float]] = {}

    def totals(self) -> dict[str, int]:
        """Supervision counts summed over coordinators (as of their last append)."""
        out: Counter[str] = Counter()
        for counts in self.supervision.values():
            out.update(counts)
        return dict(out)

    def restart_figures(self) -> dict[str, float]:
        """Group restarts timed over every coordinator (up to its last
        append): how many, and their median and largest duration in ms."""
        times = sorted(t for each in self.restart_s.values() for t in each)
        if not times:
            return {"count": 0}
        return {
            "count": len(times),
            "p50_ms": round(times[len(times) // 2] * 1000, 1),
            "max_ms": round(times[-1] * 1000, 1),
        }

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.count
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written waits
        self.offset += len(whole)
        for line in whole.splitlines():
            event = json.loads(line)
            self.supervision[event["coordinator"]] = {
                k: event[k] for k in Supervision.__struct_fields__
            }
            if event["kind"] != "append":
                continue  # restarts seen between appends
            self.count += 1
            self.redone += event["attempt"] > 0
            # each line carries the restarts since the coordinator's previous one
            self.restart_s.setdefault(event["coordinator"], []).extend(event["restart_s"])
        return self.count


def client_shard(run: RunContext, name: str) -> Shard:
    """Shard ``name`` of the run, through its consensus server."""
    return open_shard(
        name,
        blob=run.cluster.blob_uri,
        consensus=run.bind,
        schema=run.config.shard_schemas()[name],
        config=run.shard_config(),
        create=False,
    )


def exit_reason(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit {code}"
