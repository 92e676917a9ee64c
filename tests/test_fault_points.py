"""Fault points: parsing, seeded replay, shared budgets, and the actions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from shardsink import faults
from shardsink.storage.errors import DeterminateError, IndeterminateError


@pytest.fixture(autouse=True)
def _disarm():
    yield
    faults.disarm()


def test_specs_parse_with_clear_errors() -> None:
    assert faults.parse("append.before_cas:kill") == faults.FaultSpec("append.before_cas", "kill")
    assert faults.parse("gc.before_delete:pause:0.5:0").times == 0
    with pytest.raises(ValueError, match=r"unknown point 'nope'; known: worker\.after_encode"):
        faults.parse("nope:kill")
    with pytest.raises(ValueError, match="unknown action 'explode'"):
        faults.parse("append.before_cas:explode")
    with pytest.raises(ValueError, match="PROB must be in"):
        faults.parse("append.before_cas:kill:2")
    with pytest.raises(ValueError, match="expected NAME:ACTION"):
        faults.parse("append.before_cas")


def _firings(seed: int, hits: int) -> list[int]:
    faults.arm(["append.before_cas:determinate:0.3:0"], seed=seed, role="coordinator")
    out = []
    for i in range(hits):
        try:
            faults.point("append.before_cas")
        except DeterminateError:
            out.append(i)
    return out


def test_the_seed_replays_the_same_faults() -> None:
    first = _firings(7, 200)
    assert first == _firings(7, 200)
    assert first != _firings(8, 200)
    assert 30 < len(first) < 90  # about 30% of 200


def test_disarmed_and_other_points_do_nothing() -> None:
    faults.point("append.before_cas")
    faults.arm(["append.before_cas:indeterminate"])
    faults.point("append.after_cas")
    with pytest.raises(IndeterminateError, match=r"injected fault at append\.before_cas"):
        faults.point("append.before_cas")
    faults.point("append.before_cas")  # the budget (1) is spent


def _child(fault_dir, spec: str) -> subprocess.CompletedProcess:
    code = (
        "from shardsink import faults; faults.arm_from_env('worker g0/w0');"
        "faults.point('worker.before_report'); print('survived')"
    )
    env = {**os.environ, **faults.environ([spec], seed=1, fault_dir=fault_dir)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_kill_fires_once_per_run_across_processes(tmp_path) -> None:
    first = _child(tmp_path, "worker.before_report:kill")
    assert first.returncode == -signal.SIGKILL
    second = _child(tmp_path, "worker.before_report:kill")  # a restarted process
    assert second.returncode == 0 and "survived" in second.stdout
    (record,) = faults.fired(tmp_path)
    assert record["point"] == "worker.before_report" and record["action"] == "kill"
    assert record["role"] == "worker g0/w0"


def test_environment_is_validated_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="unknown point"):
        faults.environ(["worker.typo:kill"])
