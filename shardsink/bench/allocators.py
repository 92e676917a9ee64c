"""``shardsink bench allocators``: where a merge's Arrow memory comes from
and whether its pages go back, per allocator environment; and what starting
the consensus server as a fresh interpreter costs against forking it.

- ``merge``: ``--parts`` overlapping sorted parts of ``--rows`` rows each
  (8 x 256Ki by default: a 2M-row merge) merged as a pass merges them
  (``bench parts``' merge), each run in a fresh interpreter, the
  environments alternating ``--repeats`` times:

  - ``default``: pyarrow's defaults (mimalloc);
  - ``in-process``: the defaults, then, once pyarrow has loaded, pyarrow's
    Python-level pool set to the system one and glibc's mmap threshold
    pinned at 128 KiB (what ``lean_allocators`` did);
  - ``system``: ``ARROW_DEFAULT_MEMORY_POOL=system``;
  - ``system+2 arenas``: that and ``MALLOC_ARENA_MAX=2``;
  - ``system+128KiB``, ``system+1MiB``: that and glibc's mmap threshold
    pinned (``MALLOC_MMAP_THRESHOLD_``), so blocks above it are mapped and
    unmapped whole.

  The one :data:`~shardsink._allocator.SERVER_ENV` sets is marked.

  Medians of: seconds; peak RSS above the process's RSS before the merge;
  RSS above it once the merge's data is dropped, and after
  :func:`~shardsink._allocator.release_freed_pages` (what the server runs
  after a pass); the most each pool held (which pool the memory came from).
- ``start``: seconds from :meth:`ConsensusProcess.start` to its word that
  it is ready, forked from a cluster's zygote (before) against a fresh
  interpreter (now), alternating ``--starts`` times, and its RSS then.

Writes ``DIR/allocators.json`` and prints the tables.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from .._allocator import SERVER_ENV
from . import parts as bench_parts
from .showing import Note, nothing

DEFAULT_PARTS = 8
DEFAULT_ROWS = 256 * 1024
DEFAULT_REPEATS = 5
DEFAULT_STARTS = 5

#: Each environment: what it adds to the child's, and the child's setup.
ENVIRONMENTS = {
    "default": ({}, "-"),
    "in-process": ({}, "in-process"),
    "system": ({"ARROW_DEFAULT_MEMORY_POOL": "system"}, "-"),
    "system+2 arenas": ({"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}, "-"),
    "system+128KiB": (
        {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_MMAP_THRESHOLD_": "131072"},
        "-",
    ),
    "system+1MiB": (
        {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_MMAP_THRESHOLD_": "1048576"},
        "-",
    ),
}
_FIGURES = ("seconds", "peak_above", "after_above", "released_above")


def merges(work: Path, parts: int, rows: int, repeats: int, progress: Note = nothing) -> list[dict]:
    """The ``merge`` figures (see the module doc)."""
    blob_uri, listings = bench_parts.stage(work, parts, rows, layouts=("sorted",))
    runs: dict[str, list[dict]] = {name: [] for name in ENVIRONMENTS}
    names = list(ENVIRONMENTS)
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            env, setup = ENVIRONMENTS[name]
            figures = bench_parts.child("merge", blob_uri, listings["sorted"], env, setup)
            progress(json.dumps({"environment": name, **figures}))
            runs[name].append(figures)
    results = []
    for name, figures in runs.items():
        env, setup = ENVIRONMENTS[name]
        row = {
            "environment": name,
            "env": env,
            "server": env == SERVER_ENV and setup == "-",
            "repeats": repeats,
        }
        row.update({f: statistics.median(r[f] for r in figures) for f in _FIGURES})
        row["rows"] = figures[0]["rows"]
        row["pool"] = figures[0]["pool"]
        row["pool_peaks"] = {
            pool: max(r["pool_peaks"].get(pool, 0) for r in figures)
            for pool in figures[0]["pool_peaks"]
        }
        results.append(row)
    return results


def starts(work: Path, count: int, progress: Note = nothing) -> dict:
    """The ``start`` figures (see the module doc)."""
    import psutil

    from .. import protocol
    from ..process import Zygote, consensus
    from ..server import ServeConfig

    # a cluster's zygote, which also imports the server's role
    roles = (*protocol.CHILD_ROLES, consensus.ROLE)
    zygote = Zygote(roles, work, timeout_s=60).start()
    seconds: dict[str, list[float]] = {"fork": [], "fresh": []}
    rss: dict[str, list[int]] = {"fork": [], "fresh": []}
    try:
        for i in range(count):
            for how in ("fork", "fresh") if i % 2 == 0 else ("fresh", "fork"):
                server = consensus.ConsensusProcess(
                    f"sqlite://{work}/consensus.db",
                    f"file://{work}/blob",
                    ServeConfig(bind=f"ipc://{work}/c{i}{how}"),
                    starter=zygote if how == "fork" else None,
                    run_dir=work,
                    timeout_s=60,
                )
                started = time.perf_counter()
                try:
                    server.start()
                    seconds[how].append(time.perf_counter() - started)
                    rss[how].append(psutil.Process(server.child.pid).memory_info().rss)
                finally:
                    server.stop()
                progress(f"consensus start {how}: {seconds[how][-1]:.3f} s")
    finally:
        zygote.stop()
    return {
        "starts": count,
        **{f"{how}_s": statistics.median(s) for how, s in seconds.items()},
        **{f"{how}_rss": statistics.median(r) for how, r in rss.items()},
    }


def run(
    out: Path,
    *,
    parts: int = DEFAULT_PARTS,
    rows: int = DEFAULT_ROWS,
    repeats: int = DEFAULT_REPEATS,
    start_count: int = DEFAULT_STARTS,
    progress: Note = nothing,
) -> dict:
    """Measure both (see the module doc) and write ``out/allocators.json``;
    each run's figures to ``progress`` as they come."""
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-alloc-"))
    try:
        result = {
            "merge": merges(work, parts, rows, repeats, progress),
            "start": starts(work, start_count, progress),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "allocators.json").write_text(json.dumps(result, indent=2))
    return result
