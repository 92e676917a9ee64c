"""``chaos --out``: the report in words, the timeline from the run's files,
and a run that waits at most a tenth of its duration for its last faults."""

from __future__ import annotations

import json

import msgspec

from shardsink import faults
from shardsink.chaos import ChaosConfig, timeline
from shardsink.chaos.config import ChaosReport
from shardsink.chaos.runner import SETTLE_SHARE, settle_s, write_out
from shardsink.chaos.schedule import Event
from shardsink.chaos.words import describe, how_it_ended


def _report(**changes) -> ChaosReport:
    report = ChaosReport(
        seed=3, duration_s=60.0, shape="1x3", mode="barrier",
        faults=("kill-worker", "kill-builder", "blob-errors", "pause"), data_dir="",
        scheduled={"kill-worker": 2, "kill-builder": 1, "blob-errors": 1, "pause": 1},
        injected={"kill-worker": 2, "blob-errors": 3, "pause": 1}, released={}, missed={},
        coordinator_starts=3, coordinator_exits={"signal 9": 2}, intervals=400,
        intervals_redone=3, supervision={"restarts": 2, "consensus_restarts": 0,
                                         "abandoned_attempts": 3},
        restart_ms={"count": 2, "p50_ms": 250.0, "max_ms": 400.0}, snapshots_checked=80,
        snapshots_skipped={"skipped: DeterminateError": 4},
        maintenance={"gc: ok": 3, "gc: exit 2": 1, "compactions applied": 20},
        leaked_blobs_swept=2, segments_swept=0, violations=[], ran_s=66.0,
    )  # fmt: skip
    report.unfired = {"kill-builder": 1}
    return msgspec.structs.replace(report, **changes)


def test_the_report_in_words_has_no_codes() -> None:
    text = "\n\n".join(describe(_report(), settle_s=6.0))
    assert "then 6.0 s more for its last faults to fire" in text and "its bound: 6 s" in text
    stopping = describe(_report(), 6.0, [66.5, 70.0])[0]
    assert stopping.endswith("the cluster appended 2 intervals more, the last 4.0 s after that.")
    assert "- kill-worker (a worker killed): 2 injected of 2 scheduled." in text
    assert "- blob-errors (a blob store call failed): 3 injected in once" not in text
    assert "3 injected in 1 burst." in text
    assert (
        "- kill-builder (a builder killed): 0 injected of 1 scheduled; 1 never fired: no "
        "process reached its fault point before the run ended." in text
    )
    assert "the earlier ones ended: twice killed by SIGKILL" in text
    assert "shard gc ran 4 times (1 exited with status 2 (a fault injected into it)" in text
    assert "skipped: 4 (DeterminateError)" in text
    for code in ("signal 9", "exit 2 1", "gc: ", "scheduled 2, injected"):
        assert code not in text
    assert how_it_ended("exit 0") == "exited cleanly"
    violated = describe(_report(violations=["no interval appended for 30s"]))
    assert violated[-1] == "1 violation:\n- no interval appended for 30s"


def test_the_run_waits_a_tenth_of_its_duration_at_most() -> None:
    assert SETTLE_SHARE == 0.10
    assert settle_s(ChaosConfig(duration_s=60)) == 6.0


def test_lines_of_a_skewed_host_are_placed_by_the_monotonic_clock(tmp_path) -> None:
    """A coordinator on a host whose wall clock is 600 s ahead (a
    clock-skew) writes lines whose ``time`` is off; their ``monotonic``,
    which libfaketime leaves alone, places them."""
    started, mono = 1_000_000.0, 50.0
    events = tmp_path / "appended.jsonl"
    lines = [
        {"coordinator": 1, "time": started + 1.5, "monotonic": mono + 1.5, "latency_ms": 10.0},
        {"coordinator": 1, "time": started + 602.5, "monotonic": mono + 2.5, "latency_ms": 9.0},
        {"coordinator": 1, "time": started + 3.0, "latency_ms": 8.0},  # an older line: its time
    ]  # fmt: skip
    events.write_text("\n".join(json.dumps(x) for x in lines))
    (tmp_path / "faults").mkdir()
    line = timeline.collect(
        started=started, duration_s=5.0, ran_s=5.2, events_path=events,
        fault_dir=tmp_path / "faults", schedule=[], coordinator_starts=[started],
        started_monotonic=mono,
    )  # fmt: skip
    assert line.appends == [(1.5, 10.0), (2.5, 9.0), (3.0, 8.0)]


def test_the_timeline_comes_from_the_runs_files(tmp_path) -> None:
    started = 1_000_000.0
    events = tmp_path / "appended.jsonl"
    lines = [
        {"coordinator": 1, "time": started + 1.5, "latency_ms": 10.0, "restarts": 0},
        {"coordinator": 1, "time": started + 2.5, "latency_ms": 900.0, "restarts": 1},
        "not json: a line a killed coordinator cut",
        {"coordinator": 2, "time": started + 4.0, "latency_ms": 20.0, "restarts": 0,
         "consensus_restarts": 1},
    ]  # fmt: skip
    events.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines))
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    record = {"point": "blob.call", "action": "determinate", "role": "builder g0/b",
              "pid": 7, "time": started + 2.0}  # fmt: skip
    (fault_dir / "fired.jsonl").write_text(json.dumps(record) + "\n")
    assert faults.fired(fault_dir)[0]["point"] == "blob.call"
    schedule = [
        Event(at_s=1.0, kind="kill-worker", how="signal"),
        Event(at_s=3.0, kind="pause", how="signal", pause_s=0.5),
        Event(at_s=2.0, kind="blob-errors", how="point", point="blob.call:determinate"),
    ]
    line = timeline.collect(
        started=started, duration_s=5.0, ran_s=5.2, events_path=events, fault_dir=fault_dir,
        schedule=schedule, coordinator_starts=[started, started + 3.5],
    )  # fmt: skip
    assert line.appends == [(1.5, 10.0), (2.5, 900.0), (4.0, 20.0)]
    assert [(m.t, m.kind, m.until) for m in line.faults] == [
        (1.0, "kill-worker", None),
        (2.0, "blob-errors", None),
        (3.0, "pause", 3.5),
    ]
    assert line.faults[1].text == "blob.call determinate in builder g0/b"
    assert [(m.t, m.kind) for m in line.restarts] == [
        (2.5, "group restart"),
        (3.5, "coordinator restart"),
        (4.0, "consensus restart"),
    ]
    write_out(tmp_path / "out", _report(), line, 6.0, command="shardsink chaos --out out")
    out = tmp_path / "out"
    assert (out / "timeline.png").read_bytes().startswith(b"\x89PNG")
    assert msgspec.json.decode((out / "timeline.json").read_bytes(), type=timeline.Timeline) == line
    assert json.loads((out / "report.json").read_text())["seed"] == 3
    report = (out / "report.md").read_text()
    assert report.startswith("# shardsink chaos (seed 3)\n\nCommand: `shardsink chaos --out out`")
    assert "![timeline](timeline.png)" in report and "machine: " in report
