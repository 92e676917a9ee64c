"""A stop waits for what it killed, as long as the machine's load says it may
take, and never fails for a process that is slow to be gone: it can run no
more code once SIGKILLed (issue 41: a consensus process not reaped within a
fixed 10 s at a load of about 1,500 failed a run whose data was durable)."""

from __future__ import annotations

import logging
import signal

from shardsink.process import Child, Launch, SpawnStarter, child
from shardsink.process.child import KILLED_WAIT_S, kill_all, killed_wait_s
from tests.helpers.roles import SLEEP


def test_the_wait_for_killed_processes_scales_with_the_load(monkeypatch):
    monkeypatch.setattr(child.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(child.os, "getloadavg", lambda: (0.5, 0.0, 0.0))
    assert killed_wait_s() == KILLED_WAIT_S  # an idle machine: never below the base
    monkeypatch.setattr(child.os, "getloadavg", lambda: (1500.0, 0.0, 0.0))
    assert killed_wait_s() == KILLED_WAIT_S * 750


class _Undying:
    """A started process that never exits, whatever it is sent: the worst a
    loaded machine can make of a killed one."""

    pid = 2**22 + 1  # above any pid_max: signals to it could reach nobody anyway
    returncode = None
    stdout = None

    def __init__(self) -> None:
        self.sent: list[int] = []

    def poll(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        raise TimeoutError(f"pid {self.pid} still runs after {timeout}s")

    def send_signal(self, sig: int) -> None:
        self.sent.append(sig)


class _Starter:
    name = "fake"

    def run(self, launch, *, log_path, pgid):
        return _Undying()


def test_a_stop_names_a_process_slow_to_go_and_does_not_raise(tmp_path, caplog):
    undying = Child(Launch("consensus", "consensus", SLEEP), _Starter(), tmp_path).start()
    undying.pgid = -1  # a member of no group of ours: killpg must not be reached
    undying.leader = undying  # so kill_all signals it alone
    with caplog.at_level(logging.WARNING, logger="shardsink.process.child"):
        assert undying.stop(grace_s=0.0) is False
        assert kill_all([undying], timeout_s=0.0) == [undying]
    assert undying.proc.sent == [signal.SIGTERM, signal.SIGKILL, signal.SIGKILL]
    assert "consensus (pid" in caplog.text and "left to be reaped later" in caplog.text


def test_a_killed_child_is_reaped_and_its_log_says_so(tmp_path):
    sleeper = Child(Launch("worker", "g0/w0", SLEEP), SpawnStarter(), tmp_path).start()
    assert kill_all([sleeper]) == []
    assert sleeper.returncode == -signal.SIGKILL
    assert sleeper.log_tail().endswith("killed by signal 9 (SIGKILL), sent by its parent\n")
