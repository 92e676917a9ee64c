"""``shardsink logs``: a run's per-process logs are kept in its data dir, the
summary names them when something failed, and a worker killed before it
wrote a line has a log that says how it ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shardsink.cli import main
from shardsink.process import logs

ROOT = Path(__file__).resolve().parents[2]
KILL_W1 = "worker.before_finish:kill:1:1@worker g0/w1"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardsink.cli", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_killed_workers_log_is_kept_named_and_shown(tmp_path, capsys):
    data = tmp_path / "d"
    up = _cli("--fault", KILL_W1, "up", "--data-dir", str(data), "--intervals", "3",
              "--groups", "1", "--workers", "2")  # fmt: skip
    assert up.returncode == 0, up.stderr
    [run] = logs.runs(data / logs.LOGS)
    assert logs.ended(run)
    assert f"the processes' logs are in {run}" in up.stderr
    assert main(["logs", "--data-dir", str(data), "g0/w1"]) == 0
    out = capsys.readouterr().out
    # the first incarnation wrote nothing: its parent's lines say what became of it
    first, second = out.split("started: pid ")[1:]
    assert "killed by signal 9 (SIGKILL)\n" in first and "sent by" not in first
    assert "exited with status 0" in second
    assert main(["logs", "--data-dir", str(data), "-n", "1"]) == 0
    every = capsys.readouterr().out
    for name in ("consensus", "g0/b", "g0/w0", "g0/w1"):
        assert f"--- {name} ({logs.file_name(name)}) ---" in every
    follow = _cli("logs", "--data-dir", str(data), "--follow", "g0/w0", timeout=30)
    assert follow.returncode == 0 and "exited with status 0" in follow.stdout  # ended: it returns


def test_a_clean_run_does_not_point_at_its_logs_and_bad_names_get_one_line(tmp_path, capsys):
    data = tmp_path / "d"
    up = _cli("up", "--data-dir", str(data), "--intervals", "1", "--groups", "1", "--workers", "1")
    assert up.returncode == 0, up.stderr
    assert "logs are in" not in up.stderr
    assert main(["logs", "--data-dir", str(data), "g7/w7"]) == 1
    err = capsys.readouterr().err
    assert "no log of 'g7/w7'" in err and "g0/w0" in err and "Traceback" not in err
    assert main(["logs", "--data-dir", str(tmp_path / "none")]) == 1
    assert "no cluster ran on data dir" in capsys.readouterr().err
    assert main(["logs", "--data-dir", str(data), "--run", "-5"]) == 1
    assert "no run '-5'" in capsys.readouterr().err
