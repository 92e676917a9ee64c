"""``shardsink chaos`` end to end: short runs in the suite, long ones behind
``slow``. Each run ends with the runner's own checks (the shard exact at its
upper, every referenced blob present, nothing left running or mapped); the
suite's leak check runs on top."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import msgspec
import psutil
import pytest

from shardsink import faults, open_shard
from shardsink.chaos import FAULT_KINDS, ChaosConfig, run_chaos, schedule
from shardsink.chaos.checks import check_shards
from shardsink.chaos.context import RunContext
from shardsink.chaos.runner import _wait_gone
from shardsink.chaos.schedule import firings, kind_of
from shardsink.persist import ShardConfig
from shardsink.workloads import SCHEMA
from tests.helpers.wait import wait_until

#: What stopping a run and its final checks may add to its duration: a gc
#: left waiting for a consensus process killed under it once held every
#: stop here for 110 s.
STOP_BOUND_S = 60.0


def _run_clean(config: ChaosConfig):
    """``run_chaos(config)``'s report, checked by :func:`_assert_clean` and
    for a stop within :data:`STOP_BOUND_S`."""
    started = time.monotonic()
    report = run_chaos(config)
    took_s = time.monotonic() - started
    _assert_clean(config, report)
    assert took_s <= report.ran_s + STOP_BOUND_S, (
        f"the run stopped {took_s - report.ran_s:.0f} s late"
    )
    return report


def _assert_clean(config: ChaosConfig, report) -> None:
    assert report.violations == [], report.violations
    assert report.verdict == "valid", report.reasons
    assert report.intervals > 0  # progress (how much depends on the load)
    assert report.snapshots_checked > 0
    assert report.segments_swept == 0
    assert set(report.supervision) == {"restarts", "consensus_restarts", "abandoned_attempts"}
    # a group restart is timed once its round is done and the coordinator
    # appends again: a round that failed while restarting, or that a killed
    # or stopped coordinator left, is not; but more restarts than a round per
    # coordinator cannot all be such
    timed, restarts = report.restart_ms["count"], report.supervision["restarts"]
    assert timed <= restarts
    assert restarts <= config.groups * report.coordinator_starts or timed >= 1
    assert_every_fault_fired(config, report.injected, report.lost, report.unfired)
    # a signal that found no process in time is one of the unfired
    assert Counter(report.missed) <= Counter(report.unfired)
    # the last faults get a tenth of the duration, never more (looked at every 0.2 s)
    assert report.interrupted or report.ran_s <= config.duration_s * 1.1 + 0.3
    # every coordinator but the last exited and was started again; the last
    # was stopped, or, failing on its own when the unsettled run stopped it,
    # exited too
    ended = sum(report.coordinator_exits.values())
    assert report.coordinator_starts - ended in (0, 1)


def assert_every_fault_fired(
    config: ChaosConfig, injected: dict[str, int], lost: dict[str, int], unfired: dict[str, int]
) -> None:
    """Every fault the seed's schedule calls for was injected, none twice:
    each signal sent, each released firing (every error of a burst) fired,
    but for firings lost by a process killed as it took them, which needs a
    kill each, and those the report says never fired: the run waits a tenth
    of its duration for its last faults, and on a loaded machine one can
    still be waiting for a process to reach its point then."""
    kills = sum(n for kind, n in injected.items() if kind.startswith("kill-"))
    assert sum(lost.values()) <= kills
    events = schedule(
        config.seed,
        config.duration_s,
        config.faults,
        mode=config.mode,
        mean_gap_s=config.mean_gap_s,
        pause_max_s=config.pause_max_s,
        hosts=config.on_hosts,
        network=config.network > 0,
        network_max_s=config.network_max_s,
        transactions=config.transactions,
    )
    assert Counter(injected) + Counter(lost) + Counter(unfired) == firings(events)
    assert sum(unfired.values()) < sum(injected.values()), unfired  # the last few, not the run


def test_a_short_run_with_every_fault_kind_loses_nothing(tmp_path) -> None:
    config = ChaosConfig(
        duration_s=25,
        seed=3,
        data_dir=str(tmp_path / "run"),
        groups=1,
        workers=3,
        mean_gap_s=1.0,
    )
    report = _run_clean(config)
    assert len(report.scheduled) >= 6  # 25 s at one fault a second: most kinds


def test_a_workload_of_two_shards_killed_between_them_stays_all_or_nothing(tmp_path) -> None:
    """Orders and their lines, every interval one transaction: the consensus
    process killed with the transaction's shards prepared and not stored,
    and stored and not answered (seed 8 schedules both); the readers check
    both shards as of one time, the example's own check over them, and that
    no shard's upper ran ahead of the other's."""
    example = Path(__file__).parents[2] / "examples" / "orders_lines.py"
    config = ChaosConfig(
        duration_s=20,
        seed=8,
        data_dir=str(tmp_path / "run"),
        groups=2,
        workers=2,
        workload=f"{example}:OrdersLines",
        faults=("kill-consensus", "kill-coordinator", "consensus-errors", "kill-builder"),
        mean_gap_s=1.0,
    )
    assert config.transactions
    report = _run_clean(config)
    fired = Counter(f["point"] for f in faults.fired(tmp_path / "run" / "faults"))
    assert fired["transaction.before_store"] + fired["transaction.after_store"] >= 1, fired
    assert fired["consensus.after_store"] == 0  # no append of one shard alone
    assert report.history.verdict == "valid"


def test_a_short_run_coalescing_per_host_loses_nothing(tmp_path) -> None:
    """``coalesce`` host: the host builder is among the builders killed and
    paused, and a failure anywhere restarts it with every group."""
    config = ChaosConfig(
        duration_s=20,
        seed=8,
        data_dir=str(tmp_path / "run"),
        groups=2,
        workers=2,
        mode="best-effort",
        coalesce="host",
        mean_gap_s=1.0,
    )
    report = _run_clean(config)
    assert report.coalesce == "host"


def test_the_command_line_runs_best_effort_and_prints_json(tmp_path) -> None:
    argv = [sys.executable, "-m", "shardsink.cli", "chaos", "--duration-s", "20", "--seed", "4"]
    argv += ["--groups", "1", "--workers", "3", "--mode", "best-effort", "--mean-gap-s", "1"]
    argv += ["--json", "--data-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert json.loads((tmp_path / "out" / "report.json").read_text()) == report
    words = (tmp_path / "out" / "report.md").read_text()
    assert "The cluster appended" in words and "No violation" in words
    assert (tmp_path / "out" / "timeline.png").stat().st_size > 10_000
    # the last faults get a tenth of the duration, never more (the loop looks every 0.2 s)
    assert report["ran_s"] <= 20 * 1.1 + 0.3
    assert report["violations"] == [] and report["mode"] == "best-effort"
    assert report["verdict"] == "valid" and report["reasons"] == []
    assert report["intervals"] > 0 and report["snapshots_checked"] > 0
    config = ChaosConfig(
        duration_s=20, seed=4, groups=1, workers=3, mode="best-effort", mean_gap_s=1
    )
    assert_every_fault_fired(config, report["injected"], report["lost"], report["unfired"])


BROKEN_WORKLOAD = """
import pyarrow as pa


class Broken:
    schema = pa.schema([("key", pa.int64()), ("val", pa.string())])

    def updates(self, interval, worker, workers):
        raise RuntimeError("the workload's own bug")
"""


def test_a_run_that_never_appended_is_unknown_and_says_why(tmp_path) -> None:
    """A workload that raises in ``updates``: nothing is appended, nothing
    is violated, and the run is not passed off as valid: verdict unknown,
    exit 3, the reason naming the coordinator's exits and its last words."""
    workload = tmp_path / "broken.py"
    workload.write_text(BROKEN_WORKLOAD)
    argv = [sys.executable, "-m", "shardsink.cli", "chaos", "--duration-s", "6", "--seed", "1"]
    argv += ["--groups", "1", "--workers", "2", "--workload", f"{workload}:Broken", "--json"]
    argv += ["--data-dir", str(tmp_path / "run")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 3, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["violations"] == [] and report["intervals"] == 0
    assert report["verdict"] == "unknown"
    reasons = report["reasons"]
    assert "no shard was ever created" in reasons
    (intervals,) = [r for r in reasons if r.startswith("0 intervals appended (a verdict needs 5)")]
    assert "the workload's own bug" in intervals, intervals


def test_ctrl_c_stops_early_and_still_checks(tmp_path, popen) -> None:
    argv = [sys.executable, "-m", "shardsink.cli", "chaos", "--duration-s", "300", "--seed", "5"]
    argv += ["--groups", "1", "--workers", "2", "--json", "--data-dir", str(tmp_path / "run")]
    started = time.monotonic()
    proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = tmp_path / "run" / "appended.jsonl"

    def progressed() -> bool:
        assert proc.poll() is None, "the run ended before it was interrupted"
        return events.exists() and events.stat().st_size > 10_000

    wait_until(progressed, 120, "10 kB of appended events")
    proc.send_signal(signal.SIGINT)
    interrupted_at = time.monotonic() - started
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-3000:]
    report = json.loads(out)
    assert report["interrupted"] is True and report["violations"] == []
    assert report["ran_s"] <= interrupted_at and report["intervals"] > 0


def test_an_interrupt_anywhere_in_the_loop_still_checks(tmp_path) -> None:
    """SIGINT while the loop is busy (here in the progress callback, not its
    sleep) stops early and still reports; it used to escape and skip both."""
    sent = []

    def tick(status: dict) -> None:
        if status["intervals"] > 20 and not sent:
            sent.append(status["intervals"])
            signal.raise_signal(signal.SIGINT)  # handled before this returns

    config = ChaosConfig(duration_s=120, seed=6, data_dir=str(tmp_path / "run"), workers=2)
    before = signal.getsignal(signal.SIGINT)  # ignored when the suite runs in the background
    report = run_chaos(config, on_tick=tick)
    assert sent and report.interrupted and report.ran_s < config.duration_s
    assert report.violations == [] and report.intervals >= sent[0]
    assert signal.getsignal(signal.SIGINT) is before


def test_bad_arguments_are_named(tmp_path) -> None:
    argv = [sys.executable, "-m", "shardsink.cli", "chaos", "--faults", "kill-worker,nope"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown fault kind 'nope'; known: kill-worker" in done.stderr
    (tmp_path / "used" / "data").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds a previous run"):
        run_chaos(ChaosConfig(duration_s=1, data_dir=str(tmp_path / "used")))
    with pytest.raises(ValueError, match="pause_max_s"):
        ChaosConfig(pause_max_s=20)
    with pytest.raises(ValueError, match="chaos runs \\(and kills\\) the consensus process"):
        ChaosConfig(consensus="tcp://127.0.0.1:5000")


def test_a_fault_dir_given_holds_the_run_budgets(tmp_path, monkeypatch) -> None:
    """With ``SHARDSINK_FAULT_DIR`` given, every process of the run, each
    coordinator started again included, takes its point firings from there;
    a second run on it is refused (its budgets would start spent), leaving
    nothing behind."""
    given = tmp_path / "faults"
    monkeypatch.setenv(faults.ENV_DIR, str(given))
    config = ChaosConfig(
        duration_s=10,
        seed=2,
        data_dir=str(tmp_path / "run"),
        groups=1,
        workers=2,
        faults=("kill-coordinator", "blob-errors"),
        mean_gap_s=1.0,
    )
    report = _run_clean(config)
    fired = Counter(kind_of(f["point"], f["action"]) for f in faults.fired(given))
    assert fired and not (tmp_path / "run" / "faults").exists()
    assert all(report.injected[kind] >= n for kind, n in fired.items())
    temporary = set(Path(tempfile.gettempdir()).glob("chaos-*"))
    with pytest.raises(ValueError, match=f"fault dir {given} holds a previous run"):
        run_chaos(ChaosConfig(duration_s=1))
    assert set(Path(tempfile.gettempdir()).glob("chaos-*")) == temporary


def test_the_final_check_finds_a_lost_part(tmp_path) -> None:
    """The checker can fail: a shard missing a referenced part (and so rows)
    is reported twice over, and a blob nobody references after the sweep once."""
    config = ChaosConfig(data_dir=str(tmp_path))
    run = RunContext(config, tmp_path)
    run.data.mkdir()
    try:
        workload = config.load_workload()
        with open_shard(
            "default",
            blob=run.cluster.blob_uri,
            consensus=run.cluster.consensus_uri,
            schema=SCHEMA,
            config=ShardConfig(inline_max_bytes=0),
        ) as shard:
            writer = shard.writer()
            for i in range(4):
                writer.compare_and_append_table(workload.updates(i), i * 1000, (i + 1) * 1000)
            assert check_shards(run, {"default": shard}, "before") == 4 and run.violations == []
            batch = shard.state().ordered_batches()[-1]
            shard.blob.delete(batch.blob_keys()[0])
            shard.blob.set("default/part/stray.parquet", b"not referenced")
            check_shards(run, {"default": shard}, "after", swept=True)
    finally:
        run.sock_dir.rmdir()
    assert any("referenced blobs are missing" in v for v in run.violations)
    assert any("cannot be read back: shard 'default': part" in v for v in run.violations)
    assert any("1 unreferenced blobs remain: ['default/part/stray" in v for v in run.violations)


def test_an_orphan_of_the_run_is_found_by_its_mark_and_killed(tmp_path) -> None:
    """A process the run started that nobody ever saw in the coordinator's
    tree (orphaned at once) still counts as left running."""
    run = RunContext(ChaosConfig(data_dir=str(tmp_path)), tmp_path)
    env = {**os.environ, **run.env()}
    out = subprocess.run(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    orphan = int(out.stdout)
    try:
        assert orphan in run.left_running()
        other = RunContext(ChaosConfig(), tmp_path / "other")
        other.sock_dir.rmdir()
        assert orphan not in other.left_running()  # another run's mark
        _wait_gone(run, timeout_s=0.5)
        assert any(f"(pid {orphan})" in v for v in run.violations), run.violations
        assert psutil.wait_procs([psutil.Process(orphan)], timeout=10)[1] == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)  # ours: started by this test
        run.sock_dir.rmdir()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["barrier", "best-effort"])
def test_a_long_run(tmp_path, mode) -> None:
    config = ChaosConfig(duration_s=180, seed=11, data_dir=str(tmp_path / "run"), mode=mode)
    report = _run_clean(config)
    assert set(report.injected) >= set(FAULT_KINDS) - {"kill-group"}


@pytest.mark.postgres
@pytest.mark.s3
def test_a_short_run_on_postgresql_and_s3(tmp_path, postgres_server, s3_server) -> None:
    """The same run with the consensus in a real PostgreSQL and the blobs in a
    real S3 server: store faults hit psycopg and pyarrow's S3 client."""
    config = ChaosConfig(
        duration_s=25,
        seed=8,
        data_dir=str(tmp_path / "run"),
        blob=s3_server.blob_uri(s3_server.new_bucket()),
        consensus=postgres_server.new_database(),
        groups=1,
        workers=3,
        mode="best-effort",
        mean_gap_s=1.0,
    )
    _run_clean(config)
    with pytest.raises(ValueError, match="exists in postgresql://"):
        run_chaos(msgspec.structs.replace(config, data_dir=str(tmp_path / "again")))


def test_a_short_run_on_three_hosts_with_host_faults_loses_nothing(tmp_path, ray_cluster) -> None:
    """Groups on the three loopback nodes of the session's Ray cluster: whole
    hosts killed (their agents with them) and paused, among other faults;
    a killed host's groups run elsewhere until a new agent takes its place."""
    config = ChaosConfig(
        duration_s=20,
        seed=1,  # kill-host, pause-host, kill-worker, kill-host
        data_dir=str(tmp_path / "run"),
        hosts=f"ray:{ray_cluster.address}",
        blob_shared=True,  # every node is this machine
        groups=1,
        workers=2,
        faults=("kill-host", "pause-host", "kill-worker"),
        mean_gap_s=2.0,
    )
    report = _run_clean(config)
    assert report.injected.get("kill-host") and report.injected.get("pause-host")
