"""The checks at the end of a chaos run, and its report."""

from __future__ import annotations

import time
from collections import Counter

from .. import faults
from ..cluster.verify import verify
from ..connect import open_shard
from ..persist.config import OFFLINE
from ..persist.errors import PersistError, ShardNotFound
from ..persist.shard import Shard
from ..process import remove_dead_run_dirs
from ..server import history
from ..shm.sweep import list_segments, unlink_segment
from ..storage.contracts import temp_files
from ..storage.errors import StorageError
from . import linearizability
from .config import INTERVAL_MS, SHARD, ChaosReport, HistoryCheck
from .context import RunContext
from .nemesis import Nemesis
from .schedule import kind_of


def final_checks(run: RunContext, events: list, nemesis: Nemesis, watched) -> ChaosReport:
    """Everything stopped: check the shard on its stores, the blobs, the
    processes and the segments; build the report and its verdict.
    ``watched``: what the run saw of its coordinators (``starts``, ``exits``
    by reason, ``last_words``)."""
    ours = set(run.seen)
    left = [s for s in list_segments() if s.pid in ours]
    for segment in left:
        unlink_segment(segment)
    if left:
        run.violation(f"{len(left)} shared-memory segments left: {[str(s) for s in left[:5]]}")
    remove_dead_run_dirs()
    swept = 0
    intervals = 0
    final_upper: int | None = None
    unknown = []  # what leaves the run unable to judge, beyond too few intervals
    try:
        with open_shard(
            SHARD,
            blob=run.cluster.blob_uri,
            consensus=run.cluster.consensus_uri,
            schema=run.config.schema(),
            config=OFFLINE,  # every process of the run is gone: so are its writers
            create=False,
        ) as shard:
            check_shard(run, shard, "at the end")
            time.sleep(0.002)  # past the offline lease of the last writer seen
            shard.collect_garbage()
            swept = len(shard.sweep_leaked_blobs())
            shard.collect_garbage()
            intervals = check_shard(run, shard, "after sweeping leaked blobs and GC", swept=True)
            final_upper = shard.upper
    except ShardNotFound:  # nothing was ever appended, so nothing can be lost
        unknown.append("no shard was ever created")
    except (StorageError, PersistError) as exc:
        run.violation(f"the final checks could not read the shard: {exc}")
    run.appended.poll()
    fired = Counter(kind_of(f["point"], f["action"]) for f in faults.fired(run.fault_dir))
    injected = fired + nemesis.signalled
    counts = run.counts
    config = run.config
    history = check_history(run, final_upper)
    if history.verdict == "unknown":
        unknown.append(f"the history: {history.reason}")
    verdict, reasons = judge(run, intervals, watched, unknown)
    return ChaosReport(
        seed=config.seed,
        duration_s=config.duration_s,
        shape=f"{config.groups}x{config.workers}",
        mode=config.mode,
        coalesce=config.coalesce,
        faults=config.faults,
        data_dir=str(run.work),
        scheduled=dict(Counter(e.kind for e in events)),
        injected=dict(injected),
        released=dict(nemesis.released),
        missed=dict(nemesis.missed),
        coordinator_starts=watched.starts,
        coordinator_exits=dict(watched.exits),
        intervals=intervals,
        intervals_redone=run.appended.redone,
        supervision=run.appended.totals(),
        restart_ms=run.appended.restart_figures(),
        snapshots_checked=counts["checked"],
        snapshots_skipped={k[9:]: v for k, v in counts.items() if k.startswith("skipped: ")},
        maintenance={k: v for k, v in counts.items() if not k.startswith(("skipped", "checked"))},
        leaked_blobs_swept=swept,
        segments_swept=len(left),
        violations=list(run.violations),
        verdict=verdict,
        reasons=reasons,
        history=history,
    )


def check_history(run: RunContext, final_upper: int | None) -> HistoryCheck:
    """Check the run's history for linearizability, with a last read of the
    shard's ``final_upper`` (as the final checks found it, every process
    stopped; ``None``: no shard); an invalid one is a violation naming the
    shortest failing sub-history."""
    history.close_from_environment(run.history_path)  # this process's readers are done
    if final_upper is not None:
        with history.HistoryWriter(run.history_path) as writer:
            handle = writer.invoke(process="final checks", shard=SHARD, kind="read")
            writer.complete(handle, "ok", upper=final_upper)
    try:
        ops = history.load(run.history_path) if run.history_path.exists() else []
    except history.HistoryError as exc:
        run.violation(f"the history cannot be checked: {exc}")
        return HistoryCheck(verdict="invalid", reason=str(exc))
    began = time.monotonic()
    result = linearizability.check(ops)
    took = time.monotonic() - began
    appends = sum(op.kind == "append" and op.outcome in ("ok", "already") for op in ops)
    verdict = linearizability.verdict(result, appends, run.config.min_intervals)
    lines = result.lines()
    if verdict.verdict == "invalid":
        run.violation("the history is not linearizable:\n" + "\n".join(lines))
    return HistoryCheck(
        ops=len(ops),
        appends=appends,
        info=sum(op.outcome == "info" for op in ops),
        verdict=verdict.verdict,
        reason=verdict.reason,
        check_s=round(took, 3),
        lines=lines,
    )


def judge(run: RunContext, intervals: int, watched, unknown: list[str]) -> tuple[str, list[str]]:
    """The run's verdict and why it is not ``valid``: ``invalid`` with a
    violation; ``unknown`` when it judged too little to say (see
    :class:`~.config.ChaosReport`; ``unknown`` holds other reasons found)."""
    if run.violations:
        return "invalid", [f"{len(run.violations)} violations"]
    config = run.config
    reasons = list(unknown)
    if intervals < config.min_intervals:
        why = f"{intervals} intervals appended (a verdict needs {config.min_intervals})"
        if watched.exits:
            exits = ", ".join(f"{n} x {reason}" for reason, n in sorted(watched.exits.items()))
            why += f"; the coordinator ended {exits}, last saying: {watched.last_words!r}"
        reasons.append(why)
    if config.readers and not run.counts["checked"]:
        reasons.append(f"{config.readers} readers checked no snapshot")
    return ("unknown", reasons) if reasons else ("valid", [])


def check_shard(run: RunContext, shard: Shard, when: str, *, swept: bool = False) -> int:
    """The shard holds what its batches' digests say and, for a workload
    with one, equals the expected collection at its upper; every blob
    its state references exists (and, once ``swept``, no other blob and no
    temporary file of a killed writer does); returns the intervals it holds."""
    workload = run.config.load_workload()
    intervals = shard.upper // INTERVAL_MS
    try:
        verification = verify(shard, workload, INTERVAL_MS)
    except PersistError as exc:
        run.violation(f"{when}: the shard cannot be read back: {exc}")
    else:
        if not verification.ok:
            run.violation(f"{when}: the shard differs from what was written: {verification.detail}")
    state = shard.state()
    present = set(shard.blob.list(f"{SHARD}/"))
    missing = sorted(state.live_keys() - present)
    if missing:
        run.violation(f"{when}: {len(missing)} referenced blobs are missing: {missing[:3]}")
    if swept:
        leaked = sorted(present - state.referenced_keys())
        if leaked:
            run.violation(f"{when}: {len(leaked)} unreferenced blobs remain: {leaked[:3]}")
        temps = sorted(t.name for t in temp_files(shard.blob, f"{SHARD}/"))
        if temps:
            run.violation(f"{when}: {len(temps)} temporary files remain: {temps[:3]}")
    return intervals
