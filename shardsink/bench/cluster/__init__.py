"""``shardsink bench cluster``: the scale-out matrix, against Delta Lake and Iceberg peers.

Every run gets a fresh data directory, runs a cluster (or a peer,
:mod:`shardsink.bench.peers`) on
the embedded default stores, reads the shard back and verifies it. A run that
fails or does not verify is kept in the results with ``verified: false`` and
its ``error``, never dropped. Output, in ``--out DIR``:

- ``results.json``: ``{"runs": [...]}`` in the schema of docs/architecture.md
  (metrics and benchmark output), plus ``section``, ``repeat``, ``compaction``,
  ``error``, ``peak_rss``, where the CPU went (``machine_busy``, ``cpu_cores``
  by process kind, ``busiest`` and ``busiest_core``: see
  :func:`shardsink.bench.scale.cpu_use`) and a peer's ``commits`` /
  ``files_per_interval`` / ``metadata_bytes_per_interval`` /
  ``commit_retries`` / ``commit_failures`` / ``orphan_files``;
- ``report.md``: the exact command, the machine, the answer the matrix was
  run for (knees, the peers' ratios, saturation), one table per section, the
  checks the design promises (pass, fail, or inconclusive where a timing is
  past its bound by less than its repeats' noise: :mod:`.checks`) and
  side-by-side ratios, and for the scale sweeps where scaling stops and why;
- PNG plots: parts, blob PUTs and diff bytes per append by mode and shape;
  hydration wall time by threshold; append latency; the scale curves; the
  rate matrix's latency against rate and its runs over time; the peers;
  saturation (every one with its repeats' spread and its caption:
  :mod:`shardsink._figures`).

Ratios are measured side by side in one run: runs that are compared are
interleaved (repeat 0 of each, then repeat 1, ...) and compared by median.
The matrix's first run is run once before them all, unreported (a warm-up:
the first cluster of a bench process runs slower).

One module per job: :mod:`.matrices` (the run specs of every ``--matrix``),
:mod:`.running` (a run, a matrix, ``results.json``), :mod:`.checks` (the
report's checks), :mod:`.report` (``report.md``), :mod:`.plots` (the PNGs);
and one per matrix with a table of its own: :mod:`.hosts`, :mod:`.rates`,
:mod:`.peer_matrix`, :mod:`.saturation`.
"""

from __future__ import annotations

from .checks import checks as checks
from .matrices import (
    LATENCY_BOUNDS_MS as LATENCY_BOUNDS_MS,
    LATENCY_REPEATS as LATENCY_REPEATS,
    MATRICES as MATRICES,
    SECTIONS as SECTIONS,
    VARIANTS as VARIANTS,
    BenchClusterConfig as BenchClusterConfig,
    RunSpec as RunSpec,
    bench_config as bench_config,
    matrix as matrix,
    scale_matrix as scale_matrix,
)
from .report import write_report as write_report
from .running import command_line as command_line, run as run, run_one as run_one
