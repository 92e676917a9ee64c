"""The clients a chaos run keeps busy beside the cluster: readers checking
snapshots, and GC under the run's faults, counting the consensus process's
own maintenance (retention and compaction)."""

from __future__ import annotations

import itertools
import random
import time

from .. import workloads
from ..cluster import difference
from ..persist import (
    NotReadable,
    PartMissing,
    Reader,
    Shard,
    ShardNotFound,
    ShardState,
    comparable,
    digest,
    total_known,
)
from ..process import MODULE, Child, Launch, SpawnStarter, module_payload
from ..server import ServerClient
from ..storage import StorageError
from .config import INTERVAL_MS, MAINTENANCE_TIMEOUT_S, SINCE_LAG
from .context import RunContext, client_shard, exit_reason


def gc_command(run: RunContext, shard: str) -> list[str]:
    """The GC of ``shard`` run by hand beside the consensus process's own,
    with the leaked-blob sweep at the shortest grace the run's writer lease
    allows."""
    grace = str(run.config.writer_lease_ms)
    return ["shard", "gc", "--sweep-grace-ms", grace, "--shard", shard, "--consensus", run.bind]


#: Errors of a client while the consensus process restarts: counted, retried.
UNAVAILABLE = (StorageError, TimeoutError, ShardNotFound, OSError)


def read_loop(run: RunContext, index: int) -> None:
    """Snapshots of every shard of the run as of one random time within
    ``since .. upper - 1``, each checked (:func:`snapshot_problem`) and,
    all together, by the workload's own ``check``; for a workload without
    ``expected``, as-ofs where a batch of every shard ends. With several
    shards each round also reads their uppers around each other
    (:func:`torn`): a transaction moves them together, so no reader may
    see one shard hold an interval another does not."""
    workload = run.config.load_workload()
    schemas = run.config.shard_schemas()
    oracle = getattr(workload, "expected", None) is not None
    rng = random.Random(f"chaos:{run.config.seed}:reader:{index}")
    readers: dict[str, Reader] = {}
    shards: list[Shard] = []
    while not run.stop.wait(rng.uniform(0.05, 0.3)):
        try:
            if not readers:  # all of them or, until a later round, none
                opened = {}
                for name in schemas:
                    shards.append(client_shard(run, name))
                    opened[name] = shards[-1].reader(f"chaos-reader-{index}", lease_ms=30_000)
                readers = opened
            states, seen = lease_around(readers)
            if seen is not None:
                run.violation(f"reader {index}: {seen}")
            as_of = pick_as_of(states, oracle, rng)
            if as_of is None:
                continue
            tables = {name: reader.snapshot(as_of) for name, reader in readers.items()}
        except NotReadable:
            run.count("skipped: since moved past the as-of")
            continue
        except PartMissing as exc:
            run.violation(f"reader {index}: {exc}")
            continue
        except UNAVAILABLE as exc:
            run.count(f"skipped: {type(exc).__name__}")
            for shard in shards:
                shard.close()
            shards, readers = [], {}
            continue
        except Exception as exc:  # any other failure of a reader is a finding
            run.violation(f"reader {index} failed: {type(exc).__name__}: {exc}")
            continue
        _judge(run, index, workload, schemas, states, as_of, tables)
    for shard in shards:
        shard.close()


def _judge(run: RunContext, index, workload, schemas, states, as_of: int, tables) -> None:
    """Count or report what one round of reader ``index`` read; a workload
    whose ``expected`` or ``check`` raises is a finding too."""
    try:
        # one call of the workload's model for every shard (a model may be slow)
        models = workloads.expected_shards(workload, schemas, as_of // INTERVAL_MS + 1, as_of)
        wrong = {
            name: snapshot_problem((models or {}).get(name), states[name], as_of, table)
            for name, table in tables.items()
        }
        found = None if any(wrong.values()) else workloads.check(workload, tables)
    except ValueError as exc:
        run.violation(f"reader {index}: {exc}")
        return
    several = len(tables) > 1
    for name, problem in wrong.items():
        if problem:
            shown = f"shard {name}'s snapshot" if several else "snapshot"
            run.violation(f"reader {index}: {shown} as of {as_of} is wrong: {problem}")
    if any(wrong.values()):
        return
    if found is not None:
        run.violation(f"reader {index}: the workload's check as of {as_of}: {found}")
    elif all(problem is None for problem in wrong.values()):
        run.count("checked")
    else:
        run.count("read (batches of unknown digest)")


def lease_around(readers: dict[str, Reader]) -> tuple[dict[str, ShardState], str | None]:
    """Lease every reader's newest state, the first reader's again after the
    others' when there are several; and what :func:`torn` says of the
    uppers read."""
    names = list(readers)
    states = {name: readers[name].lease() for name in names}
    if len(names) == 1:
        return states, None
    after = readers[names[0]].lease().upper
    return states, torn(names[0], states[names[0]].upper, after, states)


def torn(first: str, before: int, after: int, states: dict[str, ShardState]) -> str | None:
    """``None`` if every shard's upper, read between two reads of shard
    ``first``'s (``before``, then ``after``), lies within them: uppers only
    grow, and a transaction moves every shard's at once, so at the moment a
    shard was read ``first``'s upper equalled its own. Else what was seen:
    an interval in some of the shards only."""
    outside = {name: s.upper for name, s in states.items() if not before <= s.upper <= after}
    if not outside:
        return None
    read = ", ".join(f"{name} {upper}" for name, upper in outside.items())
    return (
        f"shards read between two reads of {first}'s upper ({before}, then {after}) were at "
        f"{read}: an interval in some shards and not in others"
    )


def pick_as_of(states: dict[str, ShardState], oracle: bool, rng: random.Random) -> int | None:
    """A time to read every shard of ``states`` as of, within each one's
    readable range and :data:`SINCE_LAG` intervals of its upper: any time
    for a workload with an ``expected`` collection (``oracle``), else one
    where a batch of every shard ends; ``None`` if there is none yet."""
    low = max(max(s.since, s.upper - SINCE_LAG * INTERVAL_MS // 2) for s in states.values())
    high = min(s.upper for s in states.values())
    if high <= max(low, 0):
        return None
    if oracle:
        return rng.randrange(low, high)
    ends = set.intersection(*(batch_ends(s, low, high) for s in states.values()))
    return rng.choice(sorted(ends)) if ends else None


def snapshot_problem(expected, state: ShardState, as_of: int, table) -> str | None:
    """What is wrong with ``table``, a shard's snapshot as of ``as_of`` read
    under ``state``: checked against ``expected`` (the workload's expected
    collection as of then) if there is one, else by digest
    (:func:`digest_difference`); ``None`` if nothing."""
    if expected is None:
        return digest_difference(table, state, as_of)
    return None if table.equals(expected) else difference(table, expected)


def batch_ends(state: ShardState, low: int, high: int) -> set[int]:
    """The times in ``low .. high - 1`` where one of ``state``'s batches
    ends (its ``upper - 1``): a snapshot there holds whole batches only."""
    return {b.upper - 1 for b in state.batches.values() if low <= b.upper - 1 < high}


def digest_difference(table, state: ShardState, as_of: int) -> str | None:
    """``None`` if ``table`` (a snapshot as of ``as_of``, a batch's end)
    holds what the digests of ``state``'s batches up to ``as_of`` say was
    written; else what differs, or ``""`` if one of those digests is not
    known (or of another scheme) and nothing can be said."""
    written = total_known(b.digest for b in state.batches.values() if b.upper <= as_of + 1)
    if written is None or not comparable(written, table.schema):
        return ""
    read = digest.digest(table)
    if read.same_content(written):
        return None
    return (
        f"it reads {read.describe()}, the batches up to it were written with {written.describe()}"
    )


def maintenance_loop(run: RunContext, env: dict[str, str]) -> None:
    """Collect garbage in children armed with the run's fault points, and
    count the consensus process's compactions (its retention and compaction
    need nobody: they run in it)."""
    compactions: dict[int, tuple[int, int]] = {}  # by server pid: its counters restart with it
    shards = itertools.cycle(run.shard_names)  # one shard a pass, in turn
    while not run.stop.wait(run.config.maintenance_every_s):
        _count_compactions(run, compactions)
        if run.stop.is_set():
            break
        launch = Launch(
            kind="maintenance",
            name="gc",
            role=MODULE,
            payload=module_payload("shardsink.cli", gc_command(run, next(shards))),
            env=env,
            stdout="null",
        )
        child = Child(launch, SpawnStarter(), run.logs).start()
        code = _wait_gc(run, child)
        if code is None:
            child.kill()
            run.count("gc: stopped with the run" if run.stop.is_set() else "gc: timed out")
            continue
        run.count(f"gc: {'ok' if code == 0 else exit_reason(code)}")
    _count_compactions(run, compactions)
    run.count("compactions applied", sum(applied for applied, _ in compactions.values()))
    run.count("compactions abandoned", sum(abandoned for _, abandoned in compactions.values()))


#: How long a GC still running when the run stops may take to finish.
STOP_GRACE_S = 10.0


def _wait_gc(run: RunContext, child: Child) -> int | None:
    """``child``'s exit code; ``None`` once it has run for
    :data:`MAINTENANCE_TIMEOUT_S`, or for :data:`STOP_GRACE_S` after the run
    stopped: the stop waits for this thread, so a GC held up (at a fault
    point whose firing will not come, by a request lost with a killed
    server) must not hold the run's end for minutes."""
    deadline = time.monotonic() + MAINTENANCE_TIMEOUT_S
    while (code := child.wait(0.2)) is None:
        if run.stop.is_set():
            deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
        if time.monotonic() >= deadline:
            return None
    return code


def _count_compactions(run: RunContext, seen: dict[int, tuple[int, int]]) -> None:
    """Record the consensus process's compaction counters under its pid (a
    process killed since keeps the last ones seen: the few it did after are
    not counted)."""
    client = ServerClient(run.bind, timeout_s=2.0, retry_for_s=0.0)
    try:
        reply = client.stats()
    except UNAVAILABLE:
        return
    finally:
        client.close()
    mine = [c for c in reply.shards if c.shard in run.shard_names]
    if mine:
        seen[reply.pid] = (
            sum(c.compactions for c in mine),
            sum(c.compactions_abandoned for c in mine),
        )
