"""The checks at the end of a chaos run, and its report."""

from __future__ import annotations

import time
from collections import Counter

from .. import faults
from ..cluster import verify_shards
from ..connect import open_shards
from ..persist import OFFLINE, ExpireWriter, PersistError, Shard, ShardNotFound
from ..process import remove_dead_run_dirs
from ..server import history
from ..shm import list_segments, unlink_segment
from ..storage import StorageError, temp_files
from . import linearizability
from .config import INTERVAL_MS, ChaosReport, HistoryCheck
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
    final_uppers: dict[str, int] = {}
    unknown = []  # what leaves the run unable to judge, beyond too few intervals
    try:
        with open_shards(
            run.config.shard_schemas(),
            blob=run.cluster.blob_uri,
            consensus=run.cluster.consensus_uri,
            config=OFFLINE,  # every process of the run is gone: so are its writers
            create=False,
        ) as opened:
            shards = {name: opened.shard(name) for name in run.shard_names}
            check_shards(run, shards, "at the end")
            time.sleep(0.002)  # past the offline lease of the last writer seen
            swept = sum(sweep_after_run(shard) for shard in shards.values())
            intervals = check_shards(run, shards, "after sweeping leaked blobs and GC", swept=True)
            final_uppers = {name: shard.upper for name, shard in shards.items()}
    except ShardNotFound:  # nothing was ever appended, so nothing can be lost
        unknown.append("no shard was ever created")
    except (StorageError, PersistError) as exc:
        run.violation(f"the final checks could not read the shard: {exc}")
    run.appended.poll()
    fired = Counter(kind_of(f["point"], f["action"]) for f in faults.fired(run.fault_dir))
    injected = fired + nemesis.signalled
    counts = run.counts
    config = run.config
    history = check_history(run, final_uppers)
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


def check_history(run: RunContext, final_uppers: dict[str, int]) -> HistoryCheck:
    """Check the run's history for linearizability, with a last read of
    each shard's upper in ``final_uppers`` (as the final checks found them,
    every process stopped; empty: no shard); an invalid one is a violation
    naming the shortest failing sub-history."""
    history.close_from_environment(run.history_path)  # this process's readers are done
    if final_uppers:
        with history.HistoryWriter(run.history_path) as writer:
            for name, upper in final_uppers.items():
                handle = writer.invoke(process="final checks", shard=name, kind="read")
                writer.complete(handle, "ok", upper=upper)
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


def check_shards(
    run: RunContext, shards: dict[str, Shard], when: str, *, swept: bool = False
) -> int:
    """The shards, all as of one upper, hold what their batches' digests say
    and, for a workload with one, equal its expected collections; the
    workload's ``check`` holds over them (:func:`verify_shards`); every blob
    a shard's state references exists (and, once ``swept``, no other blob
    and no temporary file of a killed writer does); returns the intervals
    they hold."""
    workload = run.config.load_workload()
    try:
        verification = verify_shards(shards, workload, INTERVAL_MS)
    except PersistError as exc:
        run.violation(f"{when}: the shards cannot be read back: {exc}")
    else:
        if not verification.ok:
            run.violation(f"{when}: what was read back is wrong: {verification.detail}")
    for name, shard in shards.items():
        _check_blobs(run, shard, f"{when}, shard {name}" if len(shards) > 1 else when, swept)
    return min(shard.upper for shard in shards.values()) // INTERVAL_MS


def sweep_after_run(shard: Shard) -> int:
    """Clean ``shard`` up after a run whose every process is gone: expire
    every writer left in its state, collect garbage, sweep leaked blobs and
    temporary files, collect again; how many blobs and files the sweep
    removed. Writers are expired by name, not by a lease counted on this
    clock: one last seen by a host whose clock a clock-skew set ahead would
    outlive that lease, and keep the temporary files of its killed writes
    (a netns CI run: "1 temporary files remain")."""
    for writer in shard.state(refresh=True).writers:
        shard.machine.run(ExpireWriter(writer))
    shard.collect_garbage()
    swept = len(shard.sweep_leaked_blobs())
    shard.collect_garbage()
    return swept


def _check_blobs(run: RunContext, shard: Shard, when: str, swept: bool) -> None:
    state = shard.state()
    prefix = f"{shard.name}/"
    present = set(shard.blob.list(prefix))
    missing = sorted(state.live_keys() - present)
    if missing:
        run.violation(f"{when}: {len(missing)} referenced blobs are missing: {missing[:3]}")
    if swept:
        leaked = sorted(present - state.referenced_keys())
        if leaked:
            run.violation(f"{when}: {len(leaked)} unreferenced blobs remain: {leaked[:3]}")
        temps = sorted(t.name for t in temp_files(shard.blob, prefix))
        if temps:
            run.violation(f"{when}: {len(temps)} temporary files remain: {temps[:3]}")
