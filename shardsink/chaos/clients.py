"""The clients a chaos run keeps busy beside the cluster: readers checking
snapshots, and maintenance (since, compaction, GC) under the run's faults."""

from __future__ import annotations

import random

from ..cluster.verify import difference
from ..persist.errors import Contended, NotReadable, PartMissing, ShardNotFound
from ..process import Child, Launch, SpawnStarter, module_payload
from ..storage.errors import StorageError
from .config import INTERVAL_MS, MAINTENANCE_TIMEOUT_S, SHARD, SINCE_LAG, SWEEP_GRACE_MS
from .context import RunContext, client_shard, exit_reason

#: Errors of a client while the consensus process restarts: counted, retried.
UNAVAILABLE = (StorageError, TimeoutError, ShardNotFound, OSError)


def read_loop(run: RunContext, index: int) -> None:
    """Snapshots at random as-ofs within ``since .. upper - 1``, each checked."""
    workload = run.config.workload()
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
            as_of = rng.randrange(low, state.upper)
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
        expected = workload.expected(as_of // INTERVAL_MS + 1, as_of)
        if not table.equals(expected):
            run.violation(
                f"reader {index}: snapshot as of {as_of} is wrong: {difference(table, expected)}"
            )
        run.count("checked")
    if shard is not None:
        shard.close()


def maintenance_loop(run: RunContext, env: dict[str, str]) -> None:
    """Advance since, then compact and collect garbage in children armed with
    the run's fault points."""
    shard = None
    while not run.stop.wait(run.config.maintenance_every_s):
        try:
            if shard is None:
                shard = client_shard(run)
            upper = shard.upper
            since = upper - SINCE_LAG * INTERVAL_MS
            if since > shard.since:
                shard.advance_since(since)
        except UNAVAILABLE:
            run.count("maintenance: consensus unavailable")
            if shard is not None:
                shard.close()
            shard = None
            continue
        except Contended:  # lost every compare-and-set to the appends: next round
            run.count("maintenance: since contended")
        except Exception as exc:  # anything else is a finding, and must not end the loop
            run.violation(f"maintenance failed: {type(exc).__name__}: {exc}")
        for command in (
            ["shard", "compact"],
            ["shard", "gc", "--sweep-grace-ms", str(SWEEP_GRACE_MS)],
        ):
            if run.stop.is_set():
                break
            name = command[1]
            launch = Launch(
                kind="maintenance",
                name=name,
                role="module",
                payload=module_payload(
                    "shardsink.cli", [*command, "--consensus", run.bind, "--shard", SHARD]
                ),
                env=env,
                stdout="null",
            )
            child = Child(launch, SpawnStarter("shardsink.process"), run.logs).start()
            code = child.wait(MAINTENANCE_TIMEOUT_S)
            if code is None:
                child.kill()
                run.count(f"{name}: timed out")
                continue
            run.count(f"{name}: {'ok' if code == 0 else exit_reason(code)}")
    if shard is not None:
        shard.close()
