"""Per-process logs: a child killed before it wrote a line still has a log
saying how it ended; kept runs are bounded in number, logs in size."""

from __future__ import annotations

import os
import shutil
import signal

from shardsink.process import Child, Launch, SpawnStarter, logs, make_run_dir
from tests.helpers.roles import SLEEP


def test_a_child_killed_silently_has_a_log_saying_so(tmp_path):
    run_dir = make_run_dir("ctest", keep_logs=tmp_path / "keep")
    try:
        child = Child(Launch("worker", "g0/w1", SLEEP), SpawnStarter(), run_dir).start()
        kept = logs.runs(tmp_path / "keep")
        assert len(kept) == 1 and child.log_path == kept[0] / "g0-w1.log"
        os.kill(child.pid, signal.SIGKILL)  # not by its parent: a crash, as it sees it
        assert child.wait(10) == -signal.SIGKILL
        tail = child.log_tail()
        assert f"g0/w1 started: pid {child.pid}\n" in tail
        assert tail.endswith(f"g0/w1 (pid {child.pid}) killed by signal 9 (SIGKILL)\n")
        assert tail.count("killed by signal") == 1  # noted once per start
        child.start().kill()
        assert child.log_tail().endswith("killed by signal 9 (SIGKILL), sent by its parent\n")
    finally:
        shutil.rmtree(run_dir)
    assert kept[0].is_dir()  # the logs outlive the run directory


def test_a_directory_without_logs_holds_them_itself(tmp_path):
    assert logs.log_file(tmp_path, "g1/b") == tmp_path / "g1-b.log"


def test_only_the_newest_runs_are_kept(tmp_path):
    made = [logs.new_kept(tmp_path, f"c{i}", now=1_000_000 + i) for i in range(logs.KEEP_RUNS + 3)]
    assert logs.runs(tmp_path) == made[3:]
    logs.end(made[-1])
    assert logs.ended(made[-1]) and not logs.ended(made[-2])
    assert (made[-1] / logs.ENDED).stat().st_mode & 0o777 == 0o600  # as the logs beside it


def test_a_log_past_its_bound_is_rotated_and_appended_to_from_the_start(tmp_path):
    path = tmp_path / "w.log"
    with open(path, "ab") as writer:  # as a child holds it: appending
        writer.write(b"x" * 100)
        writer.flush()
        assert logs.rotate(path, max_bytes=200) is False
        writer.write(b"y" * 200)
        writer.flush()
        assert logs.rotate_all(tmp_path, max_bytes=200) == [path]
        writer.write(b"after\n")
        writer.flush()
    assert (tmp_path / "w.log.1").read_bytes() == b"x" * 100 + b"y" * 200
    assert path.read_bytes() == b"after\n"


def test_exit_words():
    assert logs.exit_words(2) == "exited with status 2"
    assert logs.exit_words(-9) == "killed by signal 9 (SIGKILL)"
