"""``shardsink bench read``: streaming a shard's snapshot against DuckDB over
the same live parts, side by side in one run.

For each ``--rows`` N, a 1x8 cluster writes a ``hydrate`` shard of N snapshot
rows (and one interval more), verified. Then, each in a fresh interpreter so
that its peak RSS is its own (``wait4``'s ``ru_maxrss``):

- ``shardsink read --format parquet --output F``: wall time and peak RSS;
- ``Reader.batches``: the consolidated stream read to the end, rows/s, its
  Arrow bytes, peak RSS;
- DuckDB: ``read_parquet`` of the live Parquet parts (from the shard's
  manifest) with ``GROUP BY key, val HAVING sum(diff) <> 0 ORDER BY key, val``,
  its result fetched as Arrow record batches as the stream's is: rows/s, peak
  RSS.

The read's peak RSS is held against the issue's bound (2x the Arrow bytes of
the output + 150 MiB at 2M rows, 1 GiB at 20M) and the stream's rows/s against
DuckDB's. Writes ``DIR/read.json`` and prints a table.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from .._units import MIB
from ..cluster import Cluster
from ..config import ClusterConfig
from .showing import Note, nothing

DEFAULT_ROWS = (2_000_000, 20_000_000)

_BATCHES = textwrap.dedent(
    """
    import json, sys, time
    from shardsink import open_shard
    data = sys.argv[1]
    shard = open_shard("default", blob=f"file://{data}/blob",
                       consensus=f"sqlite:///{data}/consensus.db", create=False)
    started = time.perf_counter()
    rows = nbytes = 0
    for batch in shard.batches():
        rows += batch.num_rows
        nbytes += batch.nbytes
    took = time.perf_counter() - started
    with shard.reader() as reader:
        parts = [f"{data}/blob/" + p["key"] for p in reader.manifest()["parts"]]
    shard.close()
    print(json.dumps({"rows": rows, "arrow_bytes": nbytes, "seconds": took, "parts": parts}))
    """
)

_DUCKDB = textwrap.dedent(
    """
    import json, sys, time
    import duckdb
    parts = json.loads(sys.argv[1])
    started = time.perf_counter()
    connection = duckdb.connect()
    connection.execute("SET enable_progress_bar = false")  # it writes to stdout
    result = connection.execute(
        "SELECT key, val, sum(diff) AS diff FROM read_parquet($parts) "
        "GROUP BY key, val HAVING sum(diff) <> 0 ORDER BY key, val",
        {"parts": parts},
    )
    rows = sum(batch.num_rows for batch in result.to_arrow_reader())  # Arrow, as the stream
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started}))
    """
)


#: Runs ``argv`` and writes its peak RSS (``wait4``'s ``ru_maxrss``) to a
#: file. A process's ``ru_maxrss`` starts at the high-water mark of the one it
#: was forked from, so a command started from this one (which wrote and read
#: back a shard) would show this one's peak: started from this small
#: interpreter instead, it shows its own.
_LAUNCH = textwrap.dedent(
    """
    import os, sys
    report, argv = sys.argv[1], sys.argv[2:]
    pid = os.posix_spawn(argv[0], argv, os.environ)
    _, status, usage = os.wait4(pid, 0)
    with open(report, "w") as f:
        f.write(str(usage.ru_maxrss * 1024))
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


def _run(argv: list[str]) -> tuple[str, float, int]:
    """``argv``'s stdout, wall seconds and peak RSS bytes (its own: see
    :data:`_LAUNCH`); ``RuntimeError`` with its stderr if it fails."""
    started = time.perf_counter()
    with (
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as out,
        tempfile.NamedTemporaryFile("r") as report,
    ):
        launch = [sys.executable, "-c", _LAUNCH, report.name, *argv]
        code = subprocess.run(launch, stdout=out, stderr=err, check=False).returncode
        took = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        if code != 0:
            raise RuntimeError(f"{argv[:4]} exited {code}: {err.read()[-2000:]!r}")
        return out.read().decode(), took, int(report.read())


def write_shard(data: Path, rows: int) -> bool:
    """A verified hydrate shard of ``rows`` snapshot rows in ``data``."""
    config = ClusterConfig(
        groups=1,
        workers=8,
        workload="hydrate",
        snapshot_rows=rows,
        rows_per_interval=1000,
        intervals=2,
        data_dir=str(data),
    )
    with Cluster(config) as cluster:
        return bool(cluster.run().verified)


def measure(data: Path, output: Path) -> dict:
    """The three reads of the shard in ``data`` (see the module doc)."""
    python = sys.executable
    _, read_s, read_rss = _run(
        [python, "-m", "shardsink.cli", "read", "--data-dir", str(data), "--format", "parquet",
         "--output", str(output)]
    )  # fmt: skip
    stream, _, stream_rss = _run([python, "-c", _BATCHES, str(data)])
    streamed = _last_json(stream)
    duck, _, duck_rss = _run([python, "-c", _DUCKDB, json.dumps(streamed.pop("parts"))])
    duckdb = _last_json(duck)
    return {
        "rows": streamed["rows"],
        "arrow_bytes": streamed["arrow_bytes"],
        "read_s": read_s,
        "read_peak_rss": read_rss,
        "batches_rows_per_s": streamed["rows"] / streamed["seconds"],
        "batches_peak_rss": stream_rss,
        "duckdb_rows": duckdb["rows"],
        "duckdb_rows_per_s": duckdb["rows"] / duckdb["seconds"],
        "duckdb_peak_rss": duck_rss,
    }


def _last_json(out: str) -> dict:
    """The JSON object a measuring script printed last (libraries may print
    before it); ``RuntimeError`` showing the output if there is none."""
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no result in the output: {out[-500:]!r}")


def bound(snapshot_rows: int, arrow_bytes: int) -> int:
    """The issue's bound on the read's peak RSS: 2x the output's Arrow bytes
    + 150 MiB up to a 2M-row snapshot, 1 GiB beyond."""
    return 2 * arrow_bytes + 150 * MIB if snapshot_rows <= 2_000_000 else 1024 * MIB


def run(out: Path, rows: tuple[int, ...] = DEFAULT_ROWS, progress: Note = nothing) -> dict:
    """Measure every size of ``rows`` and write ``out/read.json``; each
    shard written and each size's figures (JSON) to ``progress`` as they come."""
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shardsink-bench-read-"))
    results = []
    try:
        for n in rows:
            data = work / f"shard-{n}"
            verified = write_shard(data, n)
            progress(f"{n:,} rows written (verified: {verified})")
            row = {"snapshot_rows": n, "verified": verified, **measure(data, work / "out.parquet")}
            row["read_rss_bound"] = bound(n, row["arrow_bytes"])
            row["within_bound"] = row["read_peak_rss"] <= row["read_rss_bound"]
            row["batches_over_duckdb"] = row["batches_rows_per_s"] / row["duckdb_rows_per_s"]
            row["same_rows"] = row["rows"] == row["duckdb_rows"]
            results.append(row)
            progress(json.dumps(row))
            shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"runs": results}
    (out / "read.json").write_text(json.dumps(result, indent=2))
    return result
