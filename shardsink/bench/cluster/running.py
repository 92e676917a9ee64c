"""Running ``bench cluster``: one run in a fresh directory (:func:`run_one`),
and a whole matrix (:func:`run`), which keeps ``results.json`` current after
every run and writes the plots and ``report.md`` at the end.

A run never raises: one that fails or does not verify is a row with
``verified: false`` and its ``error`` (and ``traceback``), never dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ...config import ClusterConfig
from ...persist import NO_DIGEST_ENV
from ...workloads import Workload
from .. import scale
from ..peers import PEERS, run_peer
from ..showing import Bar, no_bar
from . import hosts, rates, saturation
from .matrices import RunSpec
from .plots import plot
from .report import write_report

if TYPE_CHECKING:
    from ...cluster import Cluster

COMPACT_EVERY = 10  # intervals between compactions when compaction is on


def run_one(spec: RunSpec, work_dir: Path, base: ClusterConfig | None = None) -> dict:
    """Run ``spec`` in a fresh ``work_dir``, a cluster run from ``base``'s
    settings (see :class:`~.matrices.BenchClusterConfig`); never raises: a failure is a
    row with ``verified: false`` and the ``error``."""
    row = {**msgspec.structs.asdict(spec), "verified": False, "error": ""}
    try:
        if spec.mode in PEERS:
            workload = Workload(spec.workload, spec.rows_per_interval, spec.snapshot_rows)
            row.update(
                run_peer(
                    spec.mode, spec.groups, spec.workers, workload, spec.intervals,
                    work_dir / "table",
                )
            )  # fmt: skip
        elif spec.mode == "pyarrow":
            from ..baseline import measure

            processes = spec.groups * spec.workers
            work_dir.mkdir(parents=True)
            row.update(measure(f"file://{work_dir}/blob", spec.snapshot_rows, processes))
            row["verified"] = True
        else:
            row.update(_run_cluster(spec, work_dir, base or ClusterConfig()))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc(limit=5)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return row


def _run_cluster(spec: RunSpec, work_dir: Path, base: ClusterConfig) -> dict:
    """One cluster run of ``spec`` at full pace: its stats, where the CPU went,
    what is left in the shard's state, and its verification."""
    from ...cluster import Cluster

    config = msgspec.structs.replace(
        base,
        groups=spec.groups,
        workers=spec.workers,
        mode=spec.mode,
        coalesce=spec.coalesce,
        shared_max_bytes=spec.shared_max_bytes,
        workload=spec.workload,
        workload_args=spec.workload_args,
        rows_per_interval=spec.rows_per_interval,
        snapshot_rows=spec.snapshot_rows,
        intervals=spec.intervals,
        pace="max",
        rate=spec.rate,
        data_dir=str(work_dir / "data"),
        verify=False,
    )
    with (
        _digests(spec.digests),
        _merges_off(spec, config) as config,
        Cluster(hosts.config_for(spec, config)) as cluster,
    ):
        cpu_before = _cpu_times(cluster)
        machine_before = scale.cpu_sample()
        started = time.monotonic()
        extra = _run_intervals(cluster, spec)
        extra["machine_busy"] = scale.machine_busy(machine_before, scale.cpu_sample())
        extra.update(scale.cpu_use(cpu_before, _cpu_times(cluster), time.monotonic() - started))
        state = cluster.shard.state(refresh=True)
        extra["batches_in_state"] = len(state.batches)
        extra["thresholds"] = [r.shared_max_bytes for r in cluster.records]
        extra["parts_in_state"] = sum(len(b.parts) for b in state.batches.values())
        cluster.verify()
        stats = cluster.stats()
    row = msgspec.to_builtins(stats)  # nested Structs (distributions) as dicts too
    row["verified"] = bool(stats.verified)
    stored = stats.blob_put_bytes + stats.inline_bytes_per_append * stats.appends
    row["mb_per_s"] = stored / stats.wall_s / 1e6 if stats.wall_s else 0.0
    if not stats.verified:
        row["error"] = stats.verify_detail or "the shard does not match the workload"
    row.update(extra)
    return row


#: Sections whose runs without compaction get a consensus server that never
#: merges (:func:`_merges_off`): the compaction section's off run, and the
#: digest section, whose background merges (about 0.4 of a core at 1x4,
#: 200,000 rows, by py-spy) took a share of the two cores that varied with
#: their timing from run to run, more than the digests' own cost.
MERGES_OFF_SECTIONS = ("compaction", "digest")


@contextlib.contextmanager
def _merges_off(spec: RunSpec, config: ClusterConfig) -> Iterator[ClusterConfig]:
    """``config``, or for a run of :data:`MERGES_OFF_SECTIONS` without
    compaction, ``config`` pointed at a consensus server of its own on the
    same data dir's stores whose maintenance never merges
    (``compact_interval_s`` 0): the cluster's own consensus process merges by
    the spine's rule, so that run would compact after all."""
    if spec.section not in MERGES_OFF_SECTIONS or spec.compaction:
        yield config
        return
    from ... import datadir
    from ...process import ConsensusProcess
    from ...server import ServeConfig

    data = datadir.create(config.data_path)
    sockets = Path(tempfile.mkdtemp(prefix="shardsink-bench-"))  # ipc paths are short
    blob = datadir.blob_uri(data)
    server = ConsensusProcess(
        datadir.consensus_uri(data),
        blob,
        ServeConfig(bind=f"ipc://{sockets / 'consensus'}", compact_interval_s=0.0),
        timeout_s=config.start_timeout_s,
    )
    try:
        address = server.start().address
        yield msgspec.structs.replace(config, consensus=address, blob=blob)
    finally:
        server.stop()
        shutil.rmtree(sockets, ignore_errors=True)


@contextlib.contextmanager
def _digests(on: bool):
    """Digests off (:data:`~shardsink.persist.digest.NO_DIGEST_ENV`, which the
    cluster's processes inherit) unless ``on``."""
    if on:
        yield
        return
    os.environ[NO_DIGEST_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(NO_DIGEST_ENV, None)


def _run_intervals(cluster: Cluster, spec: RunSpec) -> dict:
    """Run ``spec``'s intervals; with compaction, compact every
    :data:`COMPACT_EVERY` of them and return the ``compactions`` applied."""
    if not spec.compaction:
        cluster.run(spec.intervals)
        return {}
    compacted = 0
    done = 0
    while done < spec.intervals:
        step = min(COMPACT_EVERY, spec.intervals - done)
        cluster.run(step)
        done += step
        compacted += cluster.shard.compact().applied
    return {"compactions": compacted}


def _cpu_times(cluster: Cluster) -> scale.CpuTimes:
    return scale.cpu_times((p.kind, p.name, p.pid) for p in cluster.processes())


def run(
    specs: list[RunSpec],
    out: Path,
    command: str,
    *,
    base: ClusterConfig | None = None,
    progress: Bar = no_bar,
) -> list[dict]:
    """Run ``specs`` (a matrix), their clusters from ``base``
    (:func:`run_one`), each counted on ``progress`` as :func:`_run_specs`
    counts it, and write ``results.json``, plots and ``report.md`` into
    ``out``; the rows of the runs."""
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / "scratch"
    started = time.monotonic()
    try:
        with hosts.ray_for(specs, base or ClusterConfig()) as on_hosts:
            rows = _run_specs(specs, out, scratch, on_hosts, progress)
    finally:  # interrupted too: results.json holds the runs done, whole
        shutil.rmtree(scratch, ignore_errors=True)
    plot(rows, out)
    rates.write_histograms(rows, out)
    write_report(rows, out, command, time.monotonic() - started)
    return rows


def _run_specs(
    specs: list[RunSpec],
    out: Path,
    scratch: Path,
    base: ClusterConfig | None,
    progress: Bar = no_bar,
) -> list[dict]:
    """Run each spec in its own directory under ``scratch``, counted on
    ``progress`` (``bench cluster``: each described as it runs, its outcome
    noted when done); ``results.json`` is rewritten after every run. The first
    spec runs once more before them all, unreported: the first cluster of a
    bench process ran slower than the same runs later, whatever its variant
    (hydration of 4M rows at 1x2, ``--matrix hydrate`` twice and its runs
    once more in another seed's order: 0.36-0.66 s against 0.20-0.25 for
    the next two, its workers' CPU 0.54-1.10 s against 0.34-0.40)."""
    rows: list[dict] = []
    with progress("bench cluster", len(specs)) as steps:
        if specs:
            steps.describe(f"warm-up: {specs[0].label}")
            run_one(specs[0], scratch / "warm-up", base)

        def done(spec: RunSpec, row: dict) -> None:
            rows.append(row)
            mark = "ok" if row.get("verified") else f"FAILED: {row.get('error', '')[:100]}"
            steps.note(f"{spec.label}: {mark}")
            steps.advance()
            # keep what is measured even if a later run crashes the driver
            _write_results(out, rows)

        for i, spec in enumerate(specs):
            steps.describe(spec.label)
            try:
                spec = saturation.resolved(spec, rows)
            except ValueError as exc:
                done(spec, {**msgspec.structs.asdict(spec), "verified": False, "error": str(exc)})
                continue
            done(spec, run_one(spec, scratch / f"run-{i:03d}", base))
    of_baseline(rows)
    _write_results(out, rows)
    return rows


def of_baseline(rows: list[dict]) -> None:
    """Each verified hydrate run's rows/s as a fraction of the plain-pyarrow
    baseline's of its repeat (``of_baseline``; :mod:`shardsink.bench.baseline`)."""
    base = {
        r["repeat"]: r["rows_per_s"]
        for r in rows
        if r.get("section") == "hydrate" and r["mode"] == "pyarrow" and r.get("verified")
    }
    for r in rows:
        if r.get("section") == "hydrate" and r.get("verified") and r["repeat"] in base:
            r["of_baseline"] = r["rows_per_s"] / base[r["repeat"]]


def _write_results(out: Path, rows: list[dict]) -> None:
    # temp and rename: a crash or an interrupt mid-write never leaves a
    # truncated results.json, and an interrupted write leaves no temp file
    tmp = out / f".results.json.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps({"runs": rows}, indent=2, default=str) + "\n")
        tmp.replace(out / "results.json")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def command_line() -> str:
    """The command as the user typed it, for the report: ``shardsink`` and argv."""
    return " ".join(["shardsink", *sys.argv[1:]])
