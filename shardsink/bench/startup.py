"""``shardsink bench startup``: how fast a cluster starts and restarts a group,
and what its workers cost in memory, forked from a zygote against spawned as
fresh interpreters, side by side in one run.

Per start mode (``fork``, ``spawn``), interleaved, ``--repeats`` times, each
repeat in its own order (:func:`~shardsink.bench.cluster.matrices.repeat_order`,
``order`` in the JSON):

- cold start of each ``--shapes`` GxW cluster: ``Cluster.start()`` from the
  coordinator's start to every child ready (consensus process included);
- group restart: a worker of a 1xW cluster is SIGKILLed and the supervisor's
  ``restart_s`` (from its kill of the group to every member ready again) is
  taken from the next interval, ``--restarts`` times;
- memory: the proportional set size (PSS, ``memory_full_info().pss``) summed
  over the workers of a 1x8 cluster after a few intervals, so pages shared
  between them (the libraries a zygote imported once) count once in all.

Writes ``DIR/startup.json`` (every sample, the medians and the fork/spawn
ratios) and prints a table. Every cluster's shard is read back and verified.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import tempfile
from pathlib import Path

import psutil

from ..cluster import Cluster
from ..config import STARTS, ClusterConfig
from .cluster.matrices import repeat_order
from .showing import Note, nothing

DEFAULT_SHAPES = ((4, 8), (16, 8))


def _config(start: str, groups: int, workers: int, data: Path) -> ClusterConfig:
    return ClusterConfig(
        groups=groups,
        workers=workers,
        start=start,
        rows_per_interval=128,
        intervals=2,
        data_dir=str(data),
    )


def cold_start(start: str, groups: int, workers: int, work: Path) -> tuple[float, bool]:
    """Seconds ``Cluster.start()`` took, and whether a short run verified."""
    with Cluster(_config(start, groups, workers, work / f"cold-{start}-{groups}x{workers}")) as c:
        stats = c.run(2)
        return c.startup_s, bool(stats.verified)


def restarts(start: str, workers: int, n: int, work: Path) -> tuple[list[float], bool]:
    """``restart_s`` of ``n`` group restarts after SIGKILLing a worker."""
    with Cluster(_config(start, 1, workers, work / f"restart-{start}")) as cluster:
        for i in range(n):
            victim = [p for p in cluster.processes() if p.kind == "worker"][i % workers]
            os.kill(victim.pid, signal.SIGKILL)
            cluster.run(1)
        stats = cluster.run(1)
        return list(stats.restart_s), bool(stats.verified)


def workers_pss(start: str, work: Path) -> tuple[int, bool]:
    """Summed PSS of the workers of a 1x8 cluster after a few intervals."""
    with Cluster(_config(start, 1, 8, work / f"pss-{start}")) as cluster:
        stats = cluster.run(3)
        total = 0
        for info in cluster.processes():
            if info.kind == "worker":
                total += psutil.Process(info.pid).memory_full_info().pss
        return total, bool(stats.verified)


def run(
    out: Path,
    *,
    shapes: tuple[tuple[int, int], ...] = DEFAULT_SHAPES,
    repeats: int = 3,
    restart_count: int = 5,
    progress: Note = nothing,
) -> dict:
    """Measure (see the module doc) and write ``out/startup.json``; each
    sample to ``progress`` as it comes."""
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-startup-"))
    samples: dict = {
        "cold_start_s": {s: {f"{g}x{w}": [] for g, w in shapes} for s in STARTS},
        "restart_s": {s: [] for s in STARTS},
        "workers_pss_bytes": {s: [] for s in STARTS},
    }
    verified = True
    order = [repeat_order(STARTS, repeat) for repeat in range(repeats)]
    try:
        for repeat, starts in enumerate(order):
            for start in starts:
                for g, w in shapes:
                    took, ok = cold_start(start, g, w, work)
                    samples["cold_start_s"][start][f"{g}x{w}"].append(took)
                    verified &= ok
                    progress(f"repeat {repeat}: {start} {g}x{w} cold start {took:.3f}s")
                pss, ok = workers_pss(start, work)
                samples["workers_pss_bytes"][start].append(pss)
                verified &= ok
                progress(f"repeat {repeat}: {start} 1x8 workers' PSS {pss / 2**20:.0f} MiB")
        for start in STARTS:
            took, ok = restarts(start, 8, restart_count, work)
            samples["restart_s"][start] = took
            verified &= ok
            progress(f"{start}: group restarts {[round(t, 3) for t in took]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "samples": samples,
        "median": _medians(samples),
        "verified": verified,
        "order": order,
    }
    result["fork_over_spawn"] = {
        key: _ratio(result["median"][key]) for key in ("restart_s", "workers_pss_bytes")
    }
    result["fork_over_spawn"]["cold_start_s"] = {
        shape: _ratio({s: result["median"]["cold_start_s"][s][shape] for s in STARTS})
        for shape in result["median"]["cold_start_s"]["fork"]
    }
    (out / "startup.json").write_text(json.dumps(result, indent=2))
    return result


def _medians(samples: dict) -> dict:
    def med(values):
        return statistics.median(values) if values else None

    return {
        "cold_start_s": {
            s: {shape: med(v) for shape, v in by_shape.items()}
            for s, by_shape in samples["cold_start_s"].items()
        },
        "restart_s": {s: med(v) for s, v in samples["restart_s"].items()},
        "workers_pss_bytes": {s: med(v) for s, v in samples["workers_pss_bytes"].items()},
    }


def _ratio(by_start: dict) -> float | None:
    fork, spawn = by_start.get("fork"), by_start.get("spawn")
    return fork / spawn if fork is not None and spawn else None
