"""``bench cluster``'s exit status and leftovers: exit 1 when a check fails
(``--report-only`` exits 0), and an interrupted run (SIGINT, SIGTERM)
removes its scratch directory and leaves ``results.json`` whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardsink.bench import cluster
from shardsink.bench.cluster import RunSpec
from shardsink.cli import main
from shardsink.cluster import control
from tests.helpers.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]


def spec(mode: str, intervals: int) -> RunSpec:
    return RunSpec(
        section="trickle",
        mode=mode,
        groups=1,
        workers=2,
        workload="trickle",
        rows_per_interval=64,
        intervals=intervals,
    )


def test_a_failed_check_exits_1_unless_report_only(capsys, tmp_path, monkeypatch):
    # a run that cannot start: the check "every run verified" fails
    monkeypatch.setattr(cluster, "matrix", lambda name: [spec("sideways", 3)])
    out = tmp_path / "out"
    assert main(["bench", "cluster", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("shardsink bench cluster: 1 check(s) failed (every run verified)")
    assert err.endswith(
        f"1 of 1 run(s) did not verify; see {out}/report.md (--report-only exits 0)"
    )
    assert "**FAIL**" in (out / "report.md").read_text()
    assert main(["bench", "cluster", "--out", str(tmp_path / "again"), "--report-only"]) == 0


# The child takes SIGINT as a terminal's Ctrl-C gives it, even when the suite
# runs in the background of a non-interactive shell, which starts it ignored.
SCRIPT = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from shardsink.bench import cluster
from shardsink.bench.cluster import RunSpec
from shardsink.cli import main

def spec(intervals):
    return RunSpec(section="trickle", mode="barrier", groups=1, workers=2, workload="trickle",
                   rows_per_interval=64, intervals=intervals)

cluster.matrix = lambda name: [spec(2), spec(1_000_000)]
sys.exit(main(["bench", "cluster", "--out", sys.argv[1]]))
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_leaves_no_scratch_and_whole_results(popen, tmp_path, signum):
    out = tmp_path / "out"
    proc = popen(
        [sys.executable, "-c", SCRIPT, str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def second_run_appending() -> bool:
        """Whether the first run is in results.json and the second one's cluster appends
        (its coordinator answers on its control socket only from its run's loop)."""
        assert proc.poll() is None, proc.stderr.read()
        if not (out / "results.json").exists():
            return False
        try:
            holder = control.find(out / "scratch" / "run-001" / "data")
            status = control.request(holder, control.StatusRequest(), timeout_s=1.0)
        except control.ControlError:  # not yet started, or its loop not yet running
            return False
        return isinstance(status, control.Status) and status.appends >= 1

    wait_until(second_run_appending, 120, "an append of the second run")
    proc.send_signal(signum)
    assert proc.wait(120) == 130, proc.stderr.read()
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["verified"] is True
