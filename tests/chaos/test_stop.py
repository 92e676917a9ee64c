"""A chaos run's stop of its coordinator: a clean stop that fails is a
violation once the run has settled (recovered from its last fault); before,
the coordinator may be failing on its own, and its exit is counted as any
other exit of a run."""

from __future__ import annotations

import pytest

from shardsink.chaos.config import ChaosConfig
from shardsink.chaos.context import RunContext
from shardsink.chaos.runner import _stop_coordinator, _Watched
from shardsink.process import Child, Launch, SpawnStarter
from tests.chaos.stop_roles import EXIT_AT_SIGINT
from tests.helpers.wait import wait_until


@pytest.fixture
def run(tmp_path):
    run = RunContext(ChaosConfig(data_dir=str(tmp_path)), tmp_path)
    run.logs.mkdir()
    ready = tmp_path / "ready"
    launch = Launch("coordinator", "up", EXIT_AT_SIGINT, f"2 {ready}".encode())
    run.coordinator = Child(launch, SpawnStarter(), run.logs).start()
    try:
        wait_until(ready.exists, 30, "the coordinator's SIGINT handler")
        yield run
    finally:
        run.coordinator.kill()
        run.sock_dir.rmdir()


def test_once_the_run_settled_a_failed_clean_stop_is_a_violation(run) -> None:
    watched = _Watched()
    watched.settled = True
    _stop_coordinator(run, watched)
    assert run.coordinator.returncode == 2
    assert len(run.violations) == 1
    assert run.violations[0].startswith("the coordinator's clean stop exited 2")
    assert watched.exits == {}


def test_before_the_run_settled_it_is_an_exit_of_its_own(run) -> None:
    watched = _Watched()
    _stop_coordinator(run, watched)
    assert run.coordinator.returncode == 2
    assert run.violations == []
    assert watched.exits == {"exit 2": 1}
