"""``run_chaos``: a churn cluster under a nemesis, readers and maintenance
throughout, then the checks of docs/chaos.md (The checks and the report).

The pieces, each in its own thread of this process:

- the *coordinator*: ``shardsink up`` as a child (its consensus process bound
  to a fixed ``ipc://`` address, so that clients survive restarts), started
  again on the same data dir whenever it exits before the end;
- the :class:`~.nemesis.Nemesis`, running the seeded schedule;
- *readers*, each leasing a reader through the consensus process and checking
  every snapshot at a random as-of against the workload's expected collection;
- *maintenance*: the consensus process's own (retention advances ``since``,
  compaction merges by the spine's rule; both armed with the run's fault
  points), and ``shardsink shard gc`` as children armed with them too.

After the duration the run goes on, for up to :data:`SETTLE_SHARE` of it, until the
nemesis has carried out every event, every fault point firing it released
has been taken by a process, and the cluster has appended an interval since
(it recovered from the last fault): a fault released near the end would
otherwise be left for a process that never comes, and a signal event delayed
by a restart never sent; a fault that no process reaches in that time is
reported as never fired rather than stretching the run. Then the
coordinator is stopped with SIGINT and the
shard is checked straight on its stores. Every failed check is a
*violation*; failures that faults are allowed to cause (a killed ``shard
gc``, a reader that could not reach the consensus process while it
restarted) are counted, not violations.

With ``out``, the run's report is also written there: ``report.json``,
``report.md`` (the report in words, :mod:`.words`) and the timeline
(:mod:`.timeline`: ``timeline.png``, ``timeline.json``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from .. import faults
from ..connect import open_shard
from ..persist import ShardNotFound
from ..process import MODULE, Child, Launch, SpawnStarter, Starter, module_payload
from ..storage import redact
from . import timeline
from .checks import final_checks
from .clients import maintenance_loop, read_loop
from .config import (
    INTERVAL_MS,
    MAINTENANCE_TIMEOUT_S,
    SINCE_LAG,
    ChaosConfig,
    ChaosReport,
)
from .context import RunContext, exit_reason, fault_dir_of
from .dashboard import open_dashboard
from .emulation import RunHosts
from .nemesis import Nemesis
from .schedule import firings, point_specs, schedule
from .words import describe

log = logging.getLogger(__name__)

#: How long a coordinator has to stop after SIGINT, and a child to exit.
STOP_TIMEOUT_S = 60.0
#: How long a run goes on after its duration for its scheduled faults to fire
#: and the cluster to append again, as a share of the duration: a fault that
#: no process reaches (a kill-builder whose point a run never gets to) is
#: reported as never fired, not waited for (it once stretched 60 s to 180).
SETTLE_SHARE = 0.10


def settle_s(config: ChaosConfig) -> float:
    """How long ``config``'s run waits after its faults (:data:`SETTLE_SHARE`)."""
    return SETTLE_SHARE * config.duration_s


def run_chaos(
    config: ChaosConfig,
    on_tick: Callable[[dict], None] | None = None,
    out: Path | None = None,
    command: str | None = None,
) -> ChaosReport:
    """Run ``config`` (see the module); ``on_tick`` gets a status dict about
    once a second; with ``out``, the report, in words too, and the timeline
    are written there, captioned with ``command``. ``ValueError`` if the data
    dir already holds a shard. A first SIGINT (in the main thread) ends the
    run at once, settled or not."""
    work = Path(config.data_dir) if config.data_dir else Path(tempfile.mkdtemp(prefix="chaos-"))
    if (work / "data").exists():
        raise ValueError(f"data dir {work} holds a previous run; give an empty or new one")
    try:
        _check_fresh_fault_dir(fault_dir_of(work))
    except ValueError:
        if not config.data_dir:
            work.rmdir()  # the temporary one made just now
        raise
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "logs"):
        (work / sub).mkdir()
    run = RunContext(config, work)
    try:
        _check_fresh(run)
        with _first_sigint_sets() as interrupt:
            report = _run(run, interrupt, on_tick, out, command)
    finally:
        shutil.rmtree(run.sock_dir, ignore_errors=True)
    if report.ok and not config.data_dir:
        shutil.rmtree(work, ignore_errors=True)
        report.data_dir = ""
    return report


def _check_fresh_fault_dir(fault_dir: Path) -> None:
    """``ValueError`` if ``fault_dir`` holds a previous run's budgets: its
    firings would start spent. The chaos command's own arming (its
    incarnation files) does not count: its points are replaced."""
    if not fault_dir.is_dir():
        return
    left = sorted(
        p.name for p in fault_dir.iterdir() if not p.name.startswith("incarnation.chaos.")
    )
    if left:
        raise ValueError(
            f"fault dir {fault_dir} holds a previous run ({', '.join(left[:3])}); "
            "give an empty or new one"
        )


def _check_fresh(run: RunContext) -> None:
    """``ValueError`` if a shard of the run exists already (the expected
    collections start from interval 0); throwaway stores of emulated hosts
    are new."""
    if any(run.config.emulated_stores):
        return
    for name in run.shard_names:
        try:
            with open_shard(
                name, blob=run.cluster.blob_uri, consensus=run.cluster.consensus_uri, create=False
            ):
                pass
        except ShardNotFound:
            continue
        where = redact(run.cluster.consensus_uri)
        raise ValueError(f"shard {name!r} exists in {where}: chaos needs a fresh store")


@contextlib.contextmanager
def _first_sigint_sets() -> Iterator[threading.Event]:
    """While open, the first SIGINT sets the yielded event (stop early, but
    still stop the cluster and check what was done); a second one raises
    ``KeyboardInterrupt`` as usual. A no-op outside the main thread.

    A flag rather than catching ``KeyboardInterrupt`` around a sleep: the
    exception can land anywhere in the loop, and escaping it that way skips
    the checks and the report."""
    interrupt = threading.Event()

    def on_sigint(signum, frame) -> None:
        if interrupt.is_set():
            raise KeyboardInterrupt
        log.warning("interrupted: stopping the cluster, then checking the shard")
        interrupt.set()

    if threading.current_thread() is not threading.main_thread():
        yield interrupt
        return
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interrupt
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(
    run: RunContext,
    interrupt: threading.Event,
    on_tick: Callable[[dict], None] | None,
    out: Path | None,
    command: str | None,
) -> ChaosReport:
    """One run in ``run``'s directories: arm the schedule, start the
    coordinator, the nemesis and the clients, watch until the run is over
    (:func:`_watch`), stop everything and return the final checks' report
    (written into ``out`` with the timeline, if given)."""
    config = run.config
    events = schedule(
        config.seed,
        config.duration_s,
        config.faults,
        mode=config.mode,
        mean_gap_s=config.mean_gap_s,
        pause_max_s=config.pause_max_s,
        hosts=config.on_hosts,
        network=config.network > 0,
        network_max_s=config.network_max_s,
        transactions=config.transactions,
    )
    specs = point_specs(events)
    env = _arm(run, specs)
    hosts = _emulated_hosts(run, env) if config.network else None
    env.update(run.env())  # emulated hosts': their stores, their keys
    try:
        with _environ(run.client_env()):  # this process's readers: keys, history
            return _run_on(run, hosts, events, specs, env, interrupt, on_tick, out, command)
    finally:
        if hosts is not None:
            hosts.close()


def _emulated_hosts(run: RunContext, env: dict[str, str]) -> RunHosts:
    """The run's emulated hosts, started (and ``run`` pointed at them)."""
    log.info("starting %s emulated hosts", run.config.network)
    hosts = RunHosts(run.config, run.data, run.fault_dir, run.server_env(env))
    run.use_hosts(hosts)
    return hosts


def _run_on(
    run: RunContext,
    hosts: RunHosts | None,
    events: list,
    specs: list[faults.FaultSpec],
    env: dict[str, str],
    interrupt: threading.Event,
    on_tick: Callable[[dict], None] | None,
    out: Path | None,
    command: str | None,
) -> ChaosReport:
    config = run.config
    start, started = time.monotonic(), time.time()
    mark = run.mark if config.on_hosts else ""
    nemesis = Nemesis(
        events,
        run.fault_dir,
        run.coordinator_pid,
        start,
        mark,
        network=None if hosts is None else hosts.faults,
        servers=None if hosts is None else hosts.servers,
    )
    nemesis.hold_points(specs)
    threads = _client_threads(run, env)
    watched = _Watched()
    board = open_dashboard(run, nemesis)
    try:
        _watch(run, hosts, nemesis, env, threads, start, interrupt, on_tick, watched)
    finally:
        ran_s = time.monotonic() - start
        nemesis.stop()
        run.stop.set()
        try:
            for thread in threads:
                if thread.ident is not None:  # a start that failed leaves some unstarted
                    thread.join(MAINTENANCE_TIMEOUT_S)
        finally:
            _stop_coordinator(run, watched)
            if hosts is not None:
                hosts.stop_servers()
            faults.disarm()
            if board is not None:
                board.close()
    if nemesis.error is not None:
        run.violation(f"the nemesis failed: {nemesis.error!r}")
    report = final_checks(run, events, nemesis, watched)
    if hosts is not None:
        report.supervision["server_restarts"] = hosts.restarts
    report.ran_s = round(ran_s, 1)
    report.interrupted = interrupt.is_set()
    report.lost = dict(nemesis.lost())
    report.unfired = dict(firings(events) - Counter(report.injected) - Counter(report.lost))
    line = timeline.collect(
        started=started,
        duration_s=run.config.duration_s,
        ran_s=report.ran_s,
        events_path=run.events_path,
        fault_dir=run.fault_dir,
        schedule=events,
        coordinator_starts=watched.started_at,
        host_names=None if hosts is None else hosts.names(),
        started_monotonic=start,
    )
    report.heals = timeline.recoveries(line)
    if out is not None:
        write_out(out, report, line, settle_s(run.config), command)
    return report


def write_out(
    out: Path,
    report: ChaosReport,
    line: timeline.Timeline,
    settle: float,
    command: str | None = None,
) -> None:
    """``report.json``, ``report.md`` (in words, with the command and the
    timeline) and the timeline's files in ``out``."""
    from .._figures import caption, command_line, commit, machine

    out.mkdir(parents=True, exist_ok=True)
    command = command or command_line()
    text = caption(command, note=f"seed {report.seed}")
    (out / "report.json").write_bytes(msgspec.json.format(msgspec.json.encode(report)) + b"\n")
    timeline.write(line, out, text)
    lines = [f"# shardsink chaos (seed {report.seed})", f"Command: `{command}`"]
    after = [t for t, _ in line.appends if t > report.ran_s]
    lines += [f"{commit()}; machine: {machine()}.", *describe(report, settle, after)]
    lines.append("![timeline](timeline.png)")
    (out / "report.md").write_text("\n\n".join(lines) + "\n")


def _arm(run: RunContext, specs: list[faults.FaultSpec]) -> dict[str, str]:
    """The environment every child of the run gets (the run's fault points
    armed, pauses up to ``pause_max_s``); arms, in this process, only the
    readers' point."""
    config = run.config
    env = faults.environ([str(s) for s in specs], seed=config.seed, fault_dir=run.fault_dir)
    env[faults.ENV_PAUSE] = str(config.pause_max_s)
    env.update(run.env())
    # readers live in this process: of the points, only theirs is armed here
    faults.arm(
        [s for s in specs if s.point == "reader.before_fetch"],
        seed=config.seed,
        fault_dir=run.fault_dir,
        role="reader",
        pause_s=config.pause_max_s,
    )
    return env


def _client_threads(run: RunContext, env: dict[str, str]) -> list[threading.Thread]:
    """The readers' and maintenance's threads, not started; maintenance's
    children get ``env`` and maintenance's own settings."""
    config = run.config
    threads = [
        threading.Thread(target=read_loop, args=(run, i), name=f"reader-{i}", daemon=True)
        for i in range(config.readers)
    ]
    threads.append(
        threading.Thread(
            target=maintenance_loop,
            args=(run, {**env, **run.env(maintenance=True)}),
            name="maintenance",
            daemon=True,
        )
    )
    return threads


class _Watched:
    """What :func:`_watch` saw of the coordinator: how often it was started
    (and when, wall clock), and how each of its runs ended (reason ->
    count). Filled in as it goes, so a watch that raises still leaves what
    it saw."""

    def __init__(self) -> None:
        self.starts = 0
        self.started_at: list[float] = []
        self.exits: Counter[str] = Counter()
        #: the last line a coordinator that exited left in its log
        self.last_words = ""
        #: whether the run ended recovered: every fault fired, and an
        #: interval appended since (not stopped at the end of its settling)
        self.settled = False

    def started(self) -> None:
        self.starts += 1
        self.started_at.append(time.time())

    def exited(self, child: Child) -> None:
        self.exits[exit_reason(child.returncode)] += 1
        # its last line of its own, not the line the launcher adds on its exit
        lines = [s for s in child.log_tail().strip().splitlines() if not s.startswith("[")]
        self.last_words = lines[-1] if lines else ""


def _watch(
    run: RunContext,
    hosts: RunHosts | None,
    nemesis: Nemesis,
    env: dict[str, str],
    threads: list[threading.Thread],
    start: float,
    interrupt: threading.Event,
    on_tick: Callable[[dict], None] | None,
    watched: _Watched,
) -> None:
    """Start the coordinator, the nemesis and ``threads``, then watch until
    ``interrupt``, or the duration is over and the run settled (every fault
    fired and an interval appended since), or :func:`settle_s` after the
    duration. A coordinator that exits is started again once its processes
    are gone, and so is the consensus server of emulated ``hosts``; every
    check (about every 0.2 s) that finds no append in the last
    ``stall_after_s`` records a violation."""
    config = run.config
    _start_coordinator(run, env, hosts)
    watched.started()
    nemesis.begin()
    for thread in threads:
        thread.start()
    last_appends, last_progress, next_tick = 0, time.monotonic(), 0.0
    end = start + config.duration_s
    settle = settle_s(config)
    settled_at: int | None = None  # intervals appended when every fault had fired
    while not interrupt.is_set():
        now = time.monotonic()
        if now >= end and settled_at is None and nemesis.settled():
            settled_at = last_appends
        if settled_at is not None and last_appends > settled_at:
            watched.settled = True
            break
        if now >= end + settle:
            break
        interrupt.wait(0.2)
        if hosts is not None:
            hosts.revive()
        run.note_processes()
        child = run.coordinator
        assert child is not None
        if not child.alive():
            # a killed coordinator's processes took 0.4-0.5 s to go (measured),
            # and ran a CI run 0.4 s past its end: after the end the run's
            # stop waits for them, and counts this one as the last, stopped
            if not _wait_gone(run, give_up_at=end + settle):
                break
            watched.exited(child)
            time.sleep(0.2)
            _start_coordinator(run, env, hosts)
            watched.started()
        appended = run.appended.poll()
        if appended > last_appends:
            last_appends, last_progress = appended, time.monotonic()
        elif time.monotonic() - last_progress > config.stall_after_s:
            run.violation(f"no interval appended for {config.stall_after_s:g}s")
        if on_tick is not None and time.monotonic() >= next_tick:
            next_tick = time.monotonic() + 1.0
            on_tick(_status(run, nemesis, start, appended))


def _status(run: RunContext, nemesis: Nemesis, start: float, appended: int) -> dict:
    """The status dict ``on_tick`` gets."""
    return {
        "elapsed_s": time.monotonic() - start,
        "intervals": appended,
        "injected": sum(nemesis.signalled.values()) + len(faults.fired(run.fault_dir)),
        "snapshots": run.counts["checked"],
        "violations": len(run.violations),
    }


def _start_coordinator(run: RunContext, env: dict[str, str], hosts: RunHosts | None) -> None:
    """``shardsink up`` for the run: on this machine, its consensus process
    at the run's fixed address; on emulated ``hosts``, on the coordinator's
    host, a client of theirs."""
    config = run.config
    if hosts is None:
        where = ["--data-dir", str(run.data), "--consensus-bind", run.bind, *_host_args(config)]
        starter: Starter = SpawnStarter()
    else:
        where = [*hosts.coordinator_flags(), *_host_args(config, emulated=True)]
        env = {**env, **hosts.coordinator_env()}
        starter = hosts.starter()
    args = [
        "up",
        *where,
        "--groups",
        str(config.groups),
        "--workers",
        str(config.workers),
        "--mode",
        config.mode,
        "--coalesce",
        config.coalesce,
        *config.workload_flags(run.data),
        "--rows-per-interval",
        str(config.rows_per_interval),
        "--interval-ms",
        str(INTERVAL_MS),
        "--intervals",
        str(10**9),
        "--pace",
        "max",
        "--retain",
        str(SINCE_LAG * INTERVAL_MS),
        "--writer-lease-ms",
        str(config.writer_lease_ms),
        "--append-retry-s",
        str(config.append_retry_s),
        "--interval-timeout-s",
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
    launch = Launch(
        kind="coordinator",
        name="up",
        role=MODULE,
        payload=module_payload("shardsink.cli", args),
        env={**env, **run.history_env("coordinator")},
        stdout=str(run.logs / "summaries.jsonl"),
    )
    run.coordinator = Child(launch, starter, run.logs).start()
    run.note(run.coordinator.pid, "coordinator")


def _host_args(config: ChaosConfig, *, emulated: bool = False) -> list[str]:
    """``up``'s flags for the run's hosts (none on this machine alone);
    emulated hosts give the rest (:meth:`RunHosts.coordinator_flags`)."""
    if not config.on_hosts:
        return []
    args = ["--max-hosts", str(config.max_hosts), "--host-timeout-s", str(config.host_timeout_s)]
    args += ["--host-lost", config.host_lost]
    if emulated:
        return args
    args += ["--hosts", config.hosts]
    return args + (["--blob-shared"] if config.blob_shared else [])


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while open (what its
    clients read there: CURVE keys, the history file), as it was after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _stop_coordinator(run: RunContext, watched: _Watched) -> None:
    """SIGINT the coordinator (a clean stop), SIGKILL it if it does not stop.

    A stop that hangs is a violation. So is one that fails once the run has
    settled (:attr:`_Watched.settled`). In a run stopped before it
    recovered from its last fault, the coordinator may already be failing
    on its own when the SIGINT comes: it gave up on a consensus process
    that did not answer for ``append_retry_s``, as it may at any time of a
    run, when it is started again. That exit is counted as any other
    (once in a CI run of a 20 s run, settling for 2 s: the consensus process
    restarted after a kill did not answer for 15 s, the coordinator gave up
    on its append and, stopping, exited 2 after the run's SIGINT came)."""
    child = run.coordinator
    if child is None:
        return
    if child.alive():
        if not child.stop(STOP_TIMEOUT_S, signal.SIGINT):
            run.violation(f"the coordinator did not stop within {STOP_TIMEOUT_S:g}s of SIGINT")
        elif child.returncode not in (0, 130) and watched.settled:
            run.violation(
                f"the coordinator's clean stop exited {child.returncode}:\n{child.log_tail()}"
            )
        elif child.returncode not in (0, 130):
            log.warning(
                "the coordinator exited %s at the stop, before the run recovered from its "
                "last fault: counted as an exit of its own",
                child.returncode,
            )
            watched.exited(child)
    _wait_gone(run, maintenance=True)  # the end: maintenance has stopped too


def _wait_gone(
    run: RunContext,
    *,
    maintenance: bool = False,
    timeout_s: float = 15.0,
    give_up_at: float = math.inf,
) -> bool:
    """Wait for every process of the cluster (and with ``maintenance``, of
    maintenance) to be gone: they die with their coordinator. A straggler is
    a violation, and is SIGKILLed. False, with nothing checked, if the
    monotonic clock reaches ``give_up_at`` first."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = run.left_running(maintenance=maintenance)
        if not left:
            return True
        if time.monotonic() >= give_up_at:
            return False
        if time.monotonic() > deadline:
            names = ", ".join(f"{name} (pid {pid})" for pid, name in left.items())
            run.violation(f"processes outlived their coordinator: {names}")
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # marked with this run's mark: ours
            return True
        time.sleep(0.1)
