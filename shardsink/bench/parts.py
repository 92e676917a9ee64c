"""``shardsink bench parts``: what sorted parts cost a builder and what they
save a reader, side by side in one run.

- ``builder``: rows/s of a :class:`~shardsink.persist.batches.BatchBuilder`
  fed one interval of ``--workers`` workers' consolidated parts (a group of
  a ``hydrate`` cluster, ``--builder-rows`` rows in all) and finishing it,
  into an in-memory blob store: with its parts sorted (as written now) and
  without (each part its workers' rows one after another, as earlier
  versions wrote it), ``--repeats`` times in this process, each repeat in
  its own order (:func:`~shardsink.bench.cluster.matrices.repeat_order`,
  ``order``); the median of each.
- ``memory``: ``--parts`` overlapping parts of ``--rows`` rows each (every
  part spans every key, as a group's builders' parts of one interval do),
  in a ``file://`` blob store, written sorted (as now) and unsorted (as
  earlier versions' builders wrote them, pyarrow's defaults). Each is read
  (:func:`~shardsink.persist.windows.windows`, what ``Reader.batches`` runs,
  128Ki-row windows) and merged (:func:`~shardsink.persist.windows.key_windows`
  in compaction's 32Ki-row windows, consolidated into key-sorted parts cut
  at 4 MiB, as a merge pass writes them), each in a fresh interpreter in the
  default environment, one after another: peak RSS above the process's RSS
  once it has imported everything and warmed Arrow up on a few rows, the
  Arrow pool's peak, rows/s.

Writes ``DIR/parts.json`` and prints the tables.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._units import MIB
from .showing import Note, nothing

DEFAULT_PARTS = 8
DEFAULT_ROWS = 1_000_000
DEFAULT_BUILDER_ROWS = 1_000_000
DEFAULT_WORKERS = 8
DEFAULT_REPEATS = 5

#: The child that reads or merges the parts listed in a JSON file, printing
#: one JSON line of its figures. With ``in-process`` it first does what the
#: consensus server's ``lean_allocators`` did before: pyarrow's Python-level
#: pool to the system one and glibc's mmap threshold pinned, after pyarrow
#: loaded (see ``shardsink bench allocators``).
_CHILD = textwrap.dedent(
    """
    import ctypes, gc, json, sys, time
    import msgspec, psutil
    def peak_rss():
        # this process's own high-water mark: ru_maxrss would also count the
        # parent's pages at the fork that started it
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    mode, blob_uri, listing, setup = sys.argv[1:5]
    import pyarrow as pa
    if setup == "in-process":
        pa.set_memory_pool(pa.system_memory_pool())
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)
    from functools import partial
    from shardsink._allocator import release_freed_pages
    from shardsink.persist import parts as P, windows as W
    from shardsink.persist.compaction import WINDOW_ROWS
    from shardsink.persist.config import COMPACT_PART_BYTES
    from shardsink.persist.state import BlobPart
    from shardsink.storage import open_blob
    process = psutil.Process()
    blob = open_blob(blob_uri)
    parts = msgspec.convert(json.load(open(listing)), list[BlobPart])
    schema = P.full_schema()
    load = partial(W.part_chunks, blob, "bench", schema=schema, rows=W.CHUNK_ROWS)
    as_of = max(p.ts_hi for p in parts)
    # Arrow's first group-by and Parquet round trip load code and start thread
    # pools whatever their size: warm them up on a few rows (the pool's peak,
    # which nothing resets, stays below 1 MiB), so that the figures are the read's
    from shardsink.workloads import Workload
    warm = Workload("trickle", rows_per_interval=1024).updates(0)
    P.consolidate(warm)
    _, data = P.blob_part(warm, "warm")
    P.decode_parquet(data, schema)
    warm = data = None
    gc.collect()
    before = process.memory_info().rss
    started = time.perf_counter()
    rows = written = 0
    if mode == "read":
        for window, _ in W.windows(parts, load, as_of, schema):
            rows += window.num_rows
        window = None
    else:
        writer = P.SortedPartWriter(schema)
        for table, _ in W.key_windows(parts, load, as_of, schema, window_rows=WINDOW_ROWS):
            merged = P.consolidate(table)
            rows += merged.num_rows
            writer.write(merged)
            if writer.encoded_bytes >= COMPACT_PART_BYTES:
                written += len(writer.finish("out")[1])
                writer = P.SortedPartWriter(schema)
        if writer.encoded_bytes:
            written += len(writer.finish("out")[1])
        table = merged = writer = None
    took = time.perf_counter() - started
    peak = peak_rss()
    gc.collect()
    after = process.memory_info().rss
    release_freed_pages()
    released = process.memory_info().rss
    pools = {}
    for name in ("mimalloc", "jemalloc", "system"):
        try:
            pools[name] = getattr(pa, name + "_memory_pool")().max_memory()
        except NotImplementedError:
            pass
    print(json.dumps({
        "rows": rows, "seconds": took, "rss_before": before, "peak_above": max(0, peak - before),
        "after_above": after - before, "released_above": released - before,
        "pool": pa.default_memory_pool().backend_name,
        "pool_peak": pa.default_memory_pool().max_memory(), "pool_peaks": pools,
        "written_bytes": written,
    }))
    """
)


def overlapping(parts: int, rows: int, workers: int = DEFAULT_WORKERS) -> list[list[pa.Table]]:
    """``parts`` builders' parts of ``rows`` rows each, each as its
    ``workers`` workers' consolidated tables: worker ``w`` of part ``p``
    holds every ``parts * workers``-th key from ``p * workers + w``, so every
    part spans every key (``hydrate``'s keys and values, one interval)."""
    from ..persist import parts as P
    from ..workloads import values

    stride = parts * workers
    per_worker = rows // workers
    out = []
    for p in range(parts):
        tables = []
        for w in range(workers):
            keys = np.arange(per_worker, dtype=np.int64) * stride + p * workers + w
            table = pa.table(
                {
                    "key": keys,
                    "val": values(keys),
                    "ts": np.zeros(per_worker, np.uint64),
                    "diff": np.ones(per_worker, np.int64),
                }
            )
            tables.append(P.consolidate(P.conform(table, P.full_schema())))
        out.append(tables)
    return out


def write_parts(blob, tables: list[list[pa.Table]], *, sorted_: bool) -> list[dict]:
    """Each part's workers' tables as one blob part: through
    :func:`~shardsink.persist.parts.blob_part` (sorted), or as pyarrow wrote
    a builder's part before (the workers' rows one after another, default
    options, no ``sorting_columns``). Their descriptions, as dicts."""
    import msgspec

    from ..persist import parts as P

    described = []
    for i, workers in enumerate(tables):
        table = pa.concat_tables(workers)
        key = f"bench/part/{'sorted' if sorted_ else 'legacy'}-{i}.parquet"
        part, data = P.blob_part(table, key)
        if not sorted_:
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink)
            data = sink.getvalue().to_pybytes()
            part = msgspec.structs.replace(part, encoded_bytes=len(data))
        blob.set(key, data)
        described.append(msgspec.to_builtins(part))
    return described


def child(
    mode: str, blob_uri: str, listing: Path, env: dict[str, str] | None = None, setup: str = "-"
) -> dict:
    """Run :data:`_CHILD` (``mode`` read or merge) in a fresh interpreter
    with ``env`` added to this one's environment, less any allocator setting
    of this one's; its figures."""
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k != "ARROW_DEFAULT_MEMORY_POOL" and not k.startswith("MALLOC_")
    }
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, blob_uri, str(listing), setup],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env={**inherited, **(env or {})},
    )
    if out.returncode != 0:
        raise RuntimeError(f"the {mode} child exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def stage(work: Path, parts: int, rows: int, layouts=("sorted", "legacy")) -> tuple[str, dict]:
    """Write :func:`overlapping` parts in each of ``layouts`` to a ``file://``
    store in ``work``: its URI, and per layout the JSON file listing them
    (``layout``) and their encoded bytes (``layout_bytes``)."""
    from ..faults import open_blob

    blob_uri = f"file://{work}/blob"
    blob = open_blob(blob_uri)
    tables = overlapping(parts, rows)
    listings: dict = {}
    for layout in layouts:
        described = write_parts(blob, tables, sorted_=layout == "sorted")
        listings[layout] = work / f"{layout}.json"
        listings[layout].write_text(json.dumps(described))
        listings[layout + "_bytes"] = sum(p["encoded_bytes"] for p in described)
    blob.close()
    return blob_uri, listings


def memory(work: Path, parts: int, rows: int, progress: Note = nothing) -> list[dict]:
    """The ``memory`` figures (see the module doc)."""
    blob_uri, listings = stage(work, parts, rows)
    results = []
    for mode in ("read", "merge"):
        for layout in ("sorted", "legacy"):
            figures = child(mode, blob_uri, listings[layout])
            row = {
                "mode": mode,
                "layout": layout,
                "parts": parts,
                "rows_per_part": rows,
                "encoded_bytes": listings[layout + "_bytes"],
                **figures,
                "rows_per_s": figures["rows"] / figures["seconds"],
            }
            progress(json.dumps(row))
            results.append(row)
    return results


def _batch_builder(blob, **kwargs):
    from ..persist import BatchBuilder

    return BatchBuilder(blob, "bench", writer="bench.1", **kwargs)


def builder(rows: int, workers: int, repeats: int, progress: Note = nothing) -> dict:
    """The ``builder`` figures (see the module doc)."""
    from ..persist import ShardStats, parts as P
    from ..storage import MemoryBlob
    from ..workloads import Workload
    from .cluster.matrices import repeat_order

    workload = Workload("hydrate", rows_per_interval=1, snapshot_rows=rows)
    batches = [
        b
        for w in range(workers)
        for b in P.consolidate(workload.updates(0, w, workers)).to_batches()
    ]
    sort = P.sort_updates
    seconds: dict[str, list[float]] = {"sorted": [], "unsorted": []}
    order = [repeat_order(("sorted", "unsorted"), i) for i in range(repeats)]
    for i, layouts in enumerate(order):
        for layout in layouts:
            blob = MemoryBlob(f"bench-builder-{os.getpid()}-{i}-{layout}")
            if layout == "unsorted":
                P.sort_updates = lambda table: table  # the rows as they come
            try:
                builder = _batch_builder(
                    blob,
                    lower=0,
                    upper=workload.interval_ms,
                    inline_max_bytes=0,
                    target_bytes=128 * MIB,
                    stats=ShardStats(),
                )
                started = time.perf_counter()
                for batch in batches:
                    builder.add(batch)
                built = builder.finish()
                seconds[layout].append(time.perf_counter() - started)
            finally:
                P.sort_updates = sort
            for key in built.blob_keys():
                blob.delete(key)
    added = sum(b.num_rows for b in batches)
    result = {
        "rows": added,
        "workers": workers,
        "repeats": repeats,
        "order": order,
        "sorted_rows_per_s": added / statistics.median(seconds["sorted"]),
        "unsorted_rows_per_s": added / statistics.median(seconds["unsorted"]),
    }
    result["sorted_over_unsorted"] = result["sorted_rows_per_s"] / result["unsorted_rows_per_s"]
    progress(json.dumps(result))
    return result


def run(
    out: Path,
    *,
    parts: int = DEFAULT_PARTS,
    rows: int = DEFAULT_ROWS,
    builder_rows: int = DEFAULT_BUILDER_ROWS,
    workers: int = DEFAULT_WORKERS,
    repeats: int = DEFAULT_REPEATS,
    progress: Note = nothing,
) -> dict:
    """Measure both (see the module doc) and write ``out/parts.json``; each
    figure (JSON) to ``progress`` as it comes."""
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-parts-"))
    try:
        result = {
            "builder": builder(builder_rows, workers, repeats, progress),
            "memory": memory(work, parts, rows, progress),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "parts.json").write_text(json.dumps(result, indent=2))
    return result
