"""The coordinator SIGKILLed around its compare-and-set (fault points
``append.before_cas`` / ``append.after_cas``): its cluster dies with it, and a
fresh ``shardsink up`` on the same data dir resumes from the shard's upper and
ends exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from shardsink import faults
from tests.helpers.wait import wait_until


def _survivors(fault_dir) -> list[int]:
    """Live processes that inherited this test's fault environment."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(faults.ENV_DIR) == str(fault_dir):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize(("point", "upper"), [("append.before_cas", 0), ("append.after_cas", 1)])
def test_coordinator_killed_around_its_compare_and_set(tmp_path, point, upper) -> None:
    fault_dir = tmp_path / "f"
    env = {**os.environ, **faults.environ([f"{point}:kill"], seed=1, fault_dir=fault_dir)}
    argv = [sys.executable, "-m", "shardsink.cli", "up", "--data-dir", str(tmp_path / "d")]
    argv += ["--groups", "1", "--workers", "2", "--rows-per-interval", "400", "--json"]
    first = subprocess.run([*argv, "--intervals", "3"], env=env, capture_output=True, timeout=180)
    assert first.returncode == -9, first.stderr
    assert [(f["point"], f["role"]) for f in faults.fired(fault_dir)] == [(point, "up")]
    wait_until(  # its children die with it (PR_SET_PDEATHSIG); each look scans every process
        lambda: not _survivors(fault_dir),
        15,
        lambda: f"the end of its children (left running: {_survivors(fault_dir)})",
    )
    second = subprocess.run(
        [*argv, "--intervals", "3"], env=env, capture_output=True, text=True, timeout=180
    )
    assert second.returncode == 0, second.stderr
    stats = json.loads(second.stdout)
    assert stats["verified"] is True, stats["verify_detail"]
    assert stats["upper"] == (upper + 3) * 1000  # the first append landed iff after the CaS
