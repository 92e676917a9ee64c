"""The peers: the same workloads written into Delta Lake and Iceberg
tables, the ways people write them, on the same machine, in the same
process shapes as a cluster (one worker process per cluster worker).

- ``delta-per-worker``, ``iceberg-per-worker``: every worker commits its
  own slice (one file and one commit per worker with rows), the naive
  shape shardsink's coalescing replaces; the commits race, and lose and
  retry as each library does;
- ``delta-per-interval``: every worker writes its slice as a Parquet file
  into the table, the driver commits all of the interval's files in one
  Delta transaction (one commit per interval, one file per worker);
- ``delta-coalesced``, ``iceberg-coalesced``: every worker hands its rows
  (Arrow IPC through a pipe) to one committer, the driver, which appends
  them all, one file and one commit per interval (what shardsink does
  with one builder and one consensus process).

Delta is ``deltalake`` (delta-rs), Iceberg ``pyiceberg`` with its SQL
catalog on SQLite and a local warehouse (:mod:`.delta`, :mod:`.iceberg`),
both behind one contract (:mod:`.formats`) and run by one harness
(:mod:`.harness`): workers released together for each interval, each
interval's latency from its release to its commit in an HdrHistogram, the
table read back and compared with the workload's expected collection.
A run's figures (:func:`run_peer`) use ``results.json``'s names where they
mean the same thing, and add what only a peer has: ``commit_retries`` (the
library's), ``commit_failures`` (commits it gave up on: their rows are
missing, so the run does not verify), ``orphan_files`` (files on disk no
version of the table references), ``metadata_files`` and
``metadata_bytes_per_interval``.
"""

from __future__ import annotations

from .harness import PEERS as PEERS, peer_of, run_peer as run_peer
from .registry import format_named as format_named


def modules(mode: str) -> tuple[str, ...]:
    """The modules peer ``mode`` needs installed (``ValueError`` for an
    unknown one)."""
    return format_named(peer_of(mode).format).modules
