"""``run_chaos``: a churn cluster under a nemesis, readers and maintenance
throughout, then the checks of DESIGN.md section 10.

The pieces, each in its own thread of this process:

- the *coordinator*: ``shardsink up`` as a child (its consensus process bound
  to a fixed ``ipc://`` address, so that clients survive restarts), started
  again on the same data dir whenever it exits before the end;
- the :class:`~.nemesis.Nemesis`, running the seeded schedule;
- *readers*, each leasing a reader through the consensus process and checking
  every snapshot at a random as-of against the workload's expected collection;
- *maintenance*: advancing ``since``, and ``shardsink shard compact`` and
  ``shardsink shard gc`` as children armed with the same fault points.

At the end the coordinator is stopped with SIGINT and the shard is checked
straight on its stores. Every failed check is a *violation*; failures that
faults are allowed to cause (a killed ``shard gc``, a reader that could not
reach the consensus process while it restarted) are counted, not violations.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import psutil

from .. import faults
from ..cluster.processes import Child, kill_all, reap, remove_dead_run_dirs, spawn
from ..cluster.verify import difference, verify
from ..cluster.workloads import SCHEMA, Workload
from ..config import MODES, ClusterConfig, Mode
from ..persist.config import ShardConfig
from ..persist.errors import NotReadable, PartMissing, PersistError, ShardNotFound
from ..persist.shard import Shard, open_shard
from ..shm.sweep import list_segments, unlink_segment
from ..storage.errors import StorageError
from .nemesis import Nemesis, cluster_processes
from .schedule import FAULT_KINDS, check_kinds, kind_of, point_specs, schedule

log = logging.getLogger(__name__)

SHARD = "default"
#: Interval length in the shard's time (the workload's clock, not the wall's).
INTERVAL_MS = 1000
#: ``since`` trails the upper by this many intervals; readers read within it.
SINCE_LAG = 20
#: A blob unreferenced for this long is leaked (the sweep during the run);
#: far above any pause the nemesis makes, so a part in flight is never taken.
SWEEP_GRACE_MS = 60_000
#: How long a coordinator has to stop after SIGINT, and a child to exit.
STOP_TIMEOUT_S = 60.0
#: Bound on one maintenance command.
MAINTENANCE_TIMEOUT_S = 120.0


class ChaosConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A chaos run. ``faults`` are kinds of :data:`FAULT_KINDS`; the nemesis
    injects one every ``mean_gap_s`` seconds on average; a pause lasts up to
    ``pause_max_s``. ``data_dir`` (default: a fresh temporary directory, kept
    only if the run finds a violation) must not hold a previous run. ``blob``
    and ``consensus`` name other stores than the files and SQLite database
    under it (``s3://...``, ``postgresql://...``); the shard must not exist in
    them yet. A group
    that has not reported within ``interval_timeout_s`` is restarted; no
    append for ``stall_s`` seconds is a violation (the cluster is stuck)."""

    duration_s: float = 60.0
    seed: int = 0
    data_dir: str | None = None
    blob: str | None = None
    consensus: str | None = None
    groups: int = 2
    workers: int = 3
    mode: Mode = "barrier"
    rows_per_interval: int = 200
    faults: tuple[str, ...] = FAULT_KINDS
    mean_gap_s: float = 3.0
    pause_max_s: float = 2.0
    readers: int = 2
    maintenance_every_s: float = 2.0
    interval_timeout_s: float = 10.0
    stall_s: float = 120.0

    def __post_init__(self) -> None:
        stores = ClusterConfig(blob=self.blob, consensus=self.consensus)  # their own checks
        if stores.external_server:
            raise ValueError(
                f"consensus {self.consensus!r} is a server address; chaos runs (and kills) the "
                "consensus process itself, so name its store (sqlite://, postgresql://)"
            )
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        check_kinds(self.faults)
        for name in ("groups", "workers", "rows_per_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.readers < 0:
            raise ValueError(f"readers must be >= 0, got {self.readers}")
        for name in ("mean_gap_s", "pause_max_s", "maintenance_every_s", "stall_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.pause_max_s >= self.interval_timeout_s:
            raise ValueError(
                f"pause_max_s ({self.pause_max_s}) must stay below interval_timeout_s "
                f"({self.interval_timeout_s}), or a pause is indistinguishable from a hang"
            )

    def workload(self) -> Workload:
        return Workload("churn", self.rows_per_interval, 0, INTERVAL_MS)


class ChaosReport(msgspec.Struct, kw_only=True):
    """What a chaos run did and found.

    ``injected`` counts faults by kind: signals sent and point firings
    (recorded by the process that fired). ``scheduled`` counts the schedule's
    events by kind, ``released`` the point firings the nemesis let go (one
    that no process reached before the end stays unfired), ``missed`` the
    signal events that found no process.
    ``data_dir`` is empty if the run's temporary directory was removed.
    ``coordinator_starts`` counts ``shardsink up`` runs and ``coordinator_exits``
    why each earlier one ended. ``intervals_redone`` counts intervals appended
    by an attempt after the first; ``supervision`` the coordinators' group
    restarts, consensus restarts and abandoned attempts (each as of its last
    append). ``violations`` is empty for a good run. ``ran_s`` is how long
    faults were injected, shorter than ``duration_s`` if ``interrupted``
    (Ctrl-C stops the run early; the checks still run)."""

    seed: int
    duration_s: float
    shape: str
    mode: str
    faults: tuple[str, ...]
    data_dir: str
    scheduled: dict[str, int]
    injected: dict[str, int]
    released: dict[str, int]
    missed: dict[str, int]
    coordinator_starts: int
    coordinator_exits: dict[str, int]
    intervals: int
    intervals_redone: int
    supervision: dict[str, int]
    snapshots_checked: int
    snapshots_skipped: dict[str, int]
    maintenance: dict[str, int]
    leaked_blobs_swept: int
    segments_swept: int
    violations: list[str]
    ran_s: float = 0.0
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations


class _Run:
    """State shared by the threads of one run."""

    def __init__(self, config: ChaosConfig, work: Path) -> None:
        self.config = config
        self.work = work
        self.data = work / "data"
        self.logs = work / "logs"
        self.fault_dir = work / "faults"
        self.events_path = work / "appended.jsonl"
        self.appended = _Appended(self.events_path)
        # ipc paths are short-lived and length-limited: a 0700 directory in /tmp
        self.sock_dir = Path(tempfile.mkdtemp(prefix="shardsink-chaos-"))
        self.bind = f"ipc://{self.sock_dir / 'consensus'}"
        self.cluster = ClusterConfig(
            data_dir=str(self.data),
            blob=config.blob,
            consensus=config.consensus,
            consensus_bind=self.bind,
        )
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.coordinator: Child | None = None
        # every process of the cluster seen so far: pid -> (create time, name)
        self.seen: dict[int, tuple[float, str]] = {}
        self.counts: Counter[str] = Counter()

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
        return child.pid if child is not None and child.proc.returncode is None else None

    def note_processes(self) -> None:
        pid = self.coordinator_pid()
        if pid is None:
            return
        for process in cluster_processes(pid):
            if process.pid not in self.seen:
                with contextlib.suppress(psutil.Error):
                    created = psutil.Process(process.pid).create_time()
                    self.seen[process.pid] = (created, f"{process.kind} {process.name}")

    def shard_config(self) -> ShardConfig:
        return ShardConfig(server_timeout_s=2.0, server_retry_for_s=10.0)


def run_chaos(config: ChaosConfig, on_tick: Callable[[dict], None] | None = None) -> ChaosReport:
    """Run ``config`` (see the module); ``on_tick`` gets a status dict about
    once a second. ``ValueError`` if the data dir already holds a shard."""
    work = Path(config.data_dir) if config.data_dir else Path(tempfile.mkdtemp(prefix="chaos-"))
    if (work / "data").exists():
        raise ValueError(f"data dir {work} holds a previous run; give an empty or new one")
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "logs"):
        (work / sub).mkdir()
    run = _Run(config, work)
    try:
        _check_fresh(run)
        report = _run(run, on_tick)
    finally:
        shutil.rmtree(run.sock_dir, ignore_errors=True)
    if report.ok and not config.data_dir:
        shutil.rmtree(work, ignore_errors=True)
        report.data_dir = ""
    return report


def _check_fresh(run: _Run) -> None:
    """``ValueError`` if the shard exists already (the expected collection
    starts from interval 0)."""
    try:
        with open_shard(
            SHARD, blob=run.cluster.blob_uri, consensus=run.cluster.consensus_uri, create=False
        ):
            pass
    except ShardNotFound:
        return
    raise ValueError(
        f"shard {SHARD!r} exists in {run.cluster.consensus_uri}: chaos needs a fresh store"
    )


def _run(run: _Run, on_tick: Callable[[dict], None] | None) -> ChaosReport:
    config = run.config
    events = schedule(
        config.seed,
        config.duration_s,
        config.faults,
        mean_gap_s=config.mean_gap_s,
        pause_max_s=config.pause_max_s,
    )
    specs = point_specs(events)
    start = time.monotonic()
    nemesis = Nemesis(events, run.fault_dir, run.coordinator_pid, start)
    nemesis.hold_points(specs)
    env = faults.environ([str(s) for s in specs], seed=config.seed, fault_dir=run.fault_dir)
    env[faults.ENV_PAUSE] = str(config.pause_max_s)
    # readers live in this process: of the points, only theirs is armed here
    faults.arm(
        [s for s in specs if s.point == "reader.before_fetch"],
        seed=config.seed,
        fault_dir=run.fault_dir,
        role="reader",
        pause_s=config.pause_max_s,
    )
    threads = [
        threading.Thread(target=_reader, args=(run, i), name=f"reader-{i}", daemon=True)
        for i in range(config.readers)
    ]
    threads.append(
        threading.Thread(target=_maintenance, args=(run, env), name="maintenance", daemon=True)
    )
    exits: Counter[str] = Counter()
    starts = 0
    interrupted = False
    try:
        _start_coordinator(run, env)
        starts += 1
        nemesis.begin()
        for thread in threads:
            thread.start()
        last_appends, last_progress, next_tick = 0, time.monotonic(), 0.0
        while time.monotonic() - start < config.duration_s and not interrupted:
            try:
                time.sleep(0.2)
            except KeyboardInterrupt:  # stop early, but still check what was done
                log.warning("interrupted: stopping the cluster, then checking the shard")
                interrupted = True
            run.note_processes()
            child = run.coordinator
            assert child is not None
            if child.proc.poll() is not None:
                exits[_exit_reason(child.proc.returncode)] += 1
                _wait_gone(run)
                time.sleep(0.2)
                _start_coordinator(run, env)
                starts += 1
            appended = run.appended.poll()
            if appended > last_appends:
                last_appends, last_progress = appended, time.monotonic()
            elif time.monotonic() - last_progress > config.stall_s:
                run.violation(f"no interval appended for {config.stall_s:g}s")
            if on_tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + 1.0
                on_tick(
                    {
                        "elapsed_s": time.monotonic() - start,
                        "intervals": appended,
                        "injected": sum(nemesis.signalled.values())
                        + len(faults.fired(run.fault_dir)),
                        "snapshots": run.counts["checked"],
                        "violations": len(run.violations),
                    }
                )
    finally:
        ran_s = time.monotonic() - start
        nemesis.stop()
        run.stop.set()
        for thread in threads:
            thread.join(MAINTENANCE_TIMEOUT_S)
        _stop_coordinator(run)
        faults.disarm()
    if nemesis.error is not None:
        run.violation(f"the nemesis failed: {nemesis.error!r}")
    report = _final_checks(run, events, nemesis, starts, exits)
    report.ran_s = round(ran_s, 1)
    report.interrupted = interrupted
    return report


def _start_coordinator(run: _Run, env: dict[str, str]) -> None:
    config = run.config
    args = [
        "up",
        "--data-dir",
        str(run.data),
        "--blob",
        run.cluster.blob_uri,
        "--consensus",
        run.cluster.consensus_uri,
        "--groups",
        str(config.groups),
        "--workers",
        str(config.workers),
        "--mode",
        config.mode,
        "--workload",
        "churn",
        "--rows-per-interval",
        str(config.rows_per_interval),
        "--interval-ms",
        str(INTERVAL_MS),
        "--intervals",
        str(10**9),
        "--pace",
        "max",
        "--consensus-bind",
        run.bind,
        "--interval-timeout",
        str(config.interval_timeout_s),
        "--max-restarts",
        str(10**6),
        "--events",
        str(run.events_path),
        "--seed",
        str(config.seed),
        "--no-verify",
        "--json",
        "-v",
    ]
    with open(run.logs / "summaries.jsonl", "ab") as out:
        run.coordinator = spawn(
            "coordinator", "up", args, run_dir=run.logs, stdout=out.fileno(), env=env
        )
    run.seen[run.coordinator.pid] = (_created(run.coordinator.pid), "coordinator")


def _stop_coordinator(run: _Run) -> None:
    """SIGINT the coordinator (a clean stop), SIGKILL it if it does not stop."""
    child = run.coordinator
    if child is None:
        return
    if child.proc.poll() is None:
        child.proc.send_signal(2)  # SIGINT
        try:
            reap([child], STOP_TIMEOUT_S)
        except TimeoutError:
            run.violation(f"the coordinator did not stop within {STOP_TIMEOUT_S:g}s of SIGINT")
            kill_all([child])
        else:
            if child.proc.returncode not in (0, 130):
                run.violation(
                    f"the coordinator's clean stop exited {child.proc.returncode}:\n"
                    f"{child.log_tail()}"
                )
    _wait_gone(run)


def _wait_gone(run: _Run, timeout_s: float = 15.0) -> None:
    """Wait for every process of the cluster to be gone (they die with their
    coordinator); a straggler is a violation, and is SIGKILLed."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = _alive(run)
        if not alive:
            return
        if time.monotonic() > deadline:
            names = ", ".join(f"{name} (pid {pid})" for pid, name in alive)
            run.violation(f"processes outlived their coordinator: {names}")
            for pid, _ in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            return
        time.sleep(0.1)


def _alive(run: _Run) -> list[tuple[int, str]]:
    alive = []
    for pid, (created, name) in run.seen.items():
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                alive.append((pid, name))
    return alive


def _exit_reason(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit {code}"


class _Appended:
    """Follows the coordinators' ``--events`` file: intervals appended, how
    many of them by an attempt after the first, and each coordinator's last
    supervision counts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.count = 0
        self.redone = 0
        self.supervision: dict[int, dict[str, int]] = {}

    def totals(self) -> dict[str, int]:
        """Supervision counts summed over coordinators (as of their last append)."""
        out: Counter[str] = Counter()
        for counts in self.supervision.values():
            out.update(counts)
        return dict(out)

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
            self.count += 1
            self.redone += event["attempt"] > 0
            self.supervision[event["coordinator"]] = {
                k: event[k] for k in ("restarts", "consensus_restarts", "abandoned_attempts")
            }
        return self.count


def _open(run: _Run) -> Shard:
    return open_shard(
        SHARD,
        blob=run.cluster.blob_uri,
        consensus=run.bind,
        schema=SCHEMA,
        config=run.shard_config(),
        create=False,
    )


_UNAVAILABLE = (StorageError, TimeoutError, ShardNotFound, OSError)


def _reader(run: _Run, index: int) -> None:
    """Snapshots at random as-ofs within ``since .. upper - 1``, each checked."""
    workload = run.config.workload()
    rng = random.Random(f"chaos:{run.config.seed}:reader:{index}")
    shard = reader = None
    while not run.stop.wait(rng.uniform(0.05, 0.3)):
        try:
            if shard is None:
                shard = _open(run)
                reader = shard.reader(f"chaos-reader-{index}", lease_ms=30_000)
            state = reader.lease()
            if state.upper == 0:
                continue
            low = max(state.since, state.upper - SINCE_LAG * INTERVAL_MS // 2)
            as_of = rng.randrange(low, state.upper)
            table = reader.snapshot(as_of)
        except NotReadable:
            run.count("skipped: since moved past the as-of")
            continue
        except PartMissing as exc:
            run.violation(f"reader {index}: {exc}")
            continue
        except _UNAVAILABLE as exc:
            run.count(f"skipped: {type(exc).__name__}")
            if shard is not None:
                shard.close()
            shard = reader = None
            continue
        except Exception as exc:  # any other failure of a reader is a finding
            run.violation(f"reader {index} failed: {type(exc).__name__}: {exc}")
            continue
        expected = workload.expected(as_of // INTERVAL_MS + 1, as_of)
        if not table.equals(expected):
            run.violation(
                f"reader {index}: snapshot as of {as_of} is wrong: {difference(table, expected)}"
            )
        run.count("checked")
    if shard is not None:
        shard.close()


def _maintenance(run: _Run, env: dict[str, str]) -> None:
    """Advance since, then compact and collect garbage in children armed with
    the run's fault points."""
    shard = None
    blob = run.cluster.blob_uri
    while not run.stop.wait(run.config.maintenance_every_s):
        try:
            if shard is None:
                shard = _open(run)
            upper = shard.upper
            since = upper - SINCE_LAG * INTERVAL_MS
            if since > shard.since:
                shard.advance_since(since)
        except _UNAVAILABLE:
            run.count("maintenance: consensus unavailable")
            if shard is not None:
                shard.close()
            shard = None
            continue
        for command in (
            ["shard", "compact"],
            ["shard", "gc", "--sweep-grace-ms", str(SWEEP_GRACE_MS)],
        ):
            if run.stop.is_set():
                break
            name = command[1]
            child = spawn(
                "maintenance",
                name,
                [*command, "--consensus", run.bind, "--blob", blob, "--shard", SHARD],
                run_dir=run.logs,
                stdout=subprocess.DEVNULL,
                env=env,
            )
            try:
                reap([child], MAINTENANCE_TIMEOUT_S)
            except TimeoutError:
                kill_all([child])
                run.count(f"{name}: timed out")
                continue
            code = child.proc.returncode
            run.count(f"{name}: {'ok' if code == 0 else _exit_reason(code)}")
    if shard is not None:
        shard.close()


def _created(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return 0.0


def _final_checks(
    run: _Run, events: list, nemesis: Nemesis, starts: int, exits: Counter[str]
) -> ChaosReport:
    """Everything stopped: check the shard on its stores, the blobs, the
    processes and the segments; build the report."""
    ours = set(run.seen)
    left = [s for s in list_segments() if s.pid in ours]
    for segment in left:
        unlink_segment(segment)
    if left:
        run.violation(f"{len(left)} shared-memory segments left: {[str(s) for s in left[:5]]}")
    remove_dead_run_dirs()
    swept = 0
    intervals = 0
    try:
        with open_shard(
            SHARD,
            blob=run.cluster.blob_uri,
            consensus=run.cluster.consensus_uri,
            schema=SCHEMA,
            create=False,
        ) as shard:
            _check_shard(run, shard, "at the end")
            swept = len(shard.sweep_leaked_blobs(grace_ms=0))
            shard.collect_garbage()
            intervals = _check_shard(run, shard, "after sweeping leaked blobs and GC", swept=True)
    except ShardNotFound:
        run.violation("no shard was ever created")
    except (StorageError, PersistError) as exc:
        run.violation(f"the final checks could not read the shard: {exc}")
    run.appended.poll()
    fired = Counter(kind_of(f["point"], f["action"]) for f in faults.fired(run.fault_dir))
    injected = fired + nemesis.signalled
    counts = run.counts
    config = run.config
    return ChaosReport(
        seed=config.seed,
        duration_s=config.duration_s,
        shape=f"{config.groups}x{config.workers}",
        mode=config.mode,
        faults=config.faults,
        data_dir=str(run.work),
        scheduled=dict(Counter(e.kind for e in events)),
        injected=dict(injected),
        released=dict(nemesis.released),
        missed=dict(nemesis.missed),
        coordinator_starts=starts,
        coordinator_exits=dict(exits),
        intervals=intervals,
        intervals_redone=run.appended.redone,
        supervision=run.appended.totals(),
        snapshots_checked=counts["checked"],
        snapshots_skipped={k[9:]: v for k, v in counts.items() if k.startswith("skipped: ")},
        maintenance={k: v for k, v in counts.items() if not k.startswith(("skipped", "checked"))},
        leaked_blobs_swept=swept,
        segments_swept=len(left),
        violations=list(run.violations),
    )


def _check_shard(run: _Run, shard: Shard, when: str, *, swept: bool = False) -> int:
    """The shard equals the expected collection at its upper, and every blob
    its state references exists (and, once ``swept``, no other blob does);
    returns the intervals it holds."""
    workload = run.config.workload()
    intervals = shard.upper // INTERVAL_MS
    try:
        verification = verify(shard, workload)
    except PersistError as exc:
        run.violation(f"{when}: the shard cannot be read back: {exc}")
    else:
        if not verification.ok:
            run.violation(f"{when}: the shard differs from the expected: {verification.detail}")
    state = shard.state()
    present = set(shard.blob.list(f"{SHARD}/"))
    referenced = {k for b in state.batches.values() for k in b.blob_keys()}
    referenced.update(r.key for r in state.rollups.values())
    missing = sorted(referenced - present)
    if missing:
        run.violation(f"{when}: {len(missing)} referenced blobs are missing: {missing[:3]}")
    leaked = sorted(present - state.referenced_keys())
    if swept and leaked:
        run.violation(f"{when}: {len(leaked)} unreferenced blobs remain: {leaked[:3]}")
    return intervals
