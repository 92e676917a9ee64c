"""The clients a chaos run keeps busy beside the cluster: readers checking
snapshots, and GC under the run's faults, counting the consensus process's
own maintenance (retention and compaction)."""

from __future__ import annotations

import random
import time

from .. import workloads
from ..cluster.verify import difference
from ..persist.digest import comparable, digest, total_known
from ..persist.errors import NotReadable, PartMissing, ShardNotFound
from ..persist.state import ShardState
from ..process import MODULE, Child, Launch, SpawnStarter, module_payload
from ..server.client import ServerClient
from ..storage.errors import StorageError
from .config import INTERVAL_MS, MAINTENANCE_TIMEOUT_S, SHARD, SINCE_LAG
from .context import RunContext, client_shard, exit_reason


def gc_command(run: RunContext) -> list[str]:
    """The GC run by hand beside the consensus process's own, with the
    leaked-blob sweep at the shortest grace the run's writer lease allows."""
    grace = str(run.config.writer_lease_ms)
    return ["shard", "gc", "--sweep-grace-ms", grace, "--shard", SHARD, "--consensus", run.bind]


#: Errors of a client while the consensus process restarts: counted, retried.
UNAVAILABLE = (StorageError, TimeoutError, ShardNotFound, OSError)


def read_loop(run: RunContext, index: int) -> None:
    """Snapshots at random as-ofs within ``since .. upper - 1``, each checked
    (:func:`snapshot_problem`); for a workload without ``expected``, as-ofs
    where a batch ends."""
    workload = run.config.load_workload()
    schema = run.config.schema()
    oracle = getattr(workload, "expected", None) is not None
    rng = random.Random(f"chaos:{run.config.seed}:reader:{index}")
    shard = reader = None
    while not run.stop.wait(rng.uniform(0.05, 0.3)):
        try:
            if shard is None:
                shard = client_shard(run)
                reader = shard.reader(f"chaos-reader-{index}", lease_ms=30_000)
            state = reader.lease()
            if state.upper == 0:
                continue
            low = max(state.since, state.upper - SINCE_LAG * INTERVAL_MS // 2)
            as_of = rng.randrange(low, state.upper) if oracle else batch_end(state, low, rng)
            table = reader.snapshot(as_of)
        except NotReadable:
            run.count("skipped: since moved past the as-of")
            continue
        except PartMissing as exc:
            run.violation(f"reader {index}: {exc}")
            continue
        except UNAVAILABLE as exc:
            run.count(f"skipped: {type(exc).__name__}")
            if shard is not None:
                shard.close()
            shard = reader = None
            continue
        except Exception as exc:  # any other failure of a reader is a finding
            run.violation(f"reader {index} failed: {type(exc).__name__}: {exc}")
            continue
        wrong = snapshot_problem(workload, schema, state, as_of, table)
        if wrong is None:
            run.count("checked")
        elif wrong:
            run.violation(f"reader {index}: snapshot as of {as_of} is wrong: {wrong}")
        else:
            run.count("read (batches of unknown digest)")
    if shard is not None:
        shard.close()


def snapshot_problem(
    workload: workloads.AnyWorkload, schema, state: ShardState, as_of: int, table
) -> str | None:
    """What is wrong with ``table``, the snapshot as of ``as_of`` read under
    ``state``: checked against ``workload``'s expected collection if it has
    one, else by digest (:func:`digest_difference`); ``None`` if nothing."""
    expected = workloads.expected(workload, schema, as_of // INTERVAL_MS + 1, as_of)
    if expected is None:
        return digest_difference(table, state, as_of)
    return None if table.equals(expected) else difference(table, expected)


def batch_end(state: ShardState, low: int, rng: random.Random) -> int:
    """A random time at or past ``low`` where one of ``state``'s batches
    ends (its ``upper - 1``): a snapshot there holds whole batches only."""
    ends = [b.upper - 1 for b in state.batches.values() if b.upper - 1 >= low]
    return rng.choice(ends) if ends else state.upper - 1


def digest_difference(table, state: ShardState, as_of: int) -> str | None:
    """``None`` if ``table`` (a snapshot as of ``as_of``, a batch's end)
    holds what the digests of ``state``'s batches up to ``as_of`` say was
    written; else what differs, or ``""`` if one of those digests is not
    known (or of another scheme) and nothing can be said."""
    written = total_known(b.digest for b in state.batches.values() if b.upper <= as_of + 1)
    if written is None or not comparable(written, table.schema):
        return ""
    read = digest(table)
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
    while not run.stop.wait(run.config.maintenance_every_s):
        _count_compactions(run, compactions)
        if run.stop.is_set():
            break
        launch = Launch(
            kind="maintenance",
            name="gc",
            role=MODULE,
            payload=module_payload("shardsink.cli", gc_command(run)),
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
    for counters in reply.shards:
        if counters.shard == SHARD:
            seen[reply.pid] = (counters.compactions, counters.compactions_abandoned)
