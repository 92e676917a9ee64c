"""The zygote and the child lifecycle: forks, process groups, exit statuses,
death with the parent, and nothing of the parent's reaching a child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from shardsink.process import Child, Launch, SpawnStarter, Zygote, ZygoteError, kill_all
from tests.helpers.roles import EXIT, ROLES, SLEEP
from tests.helpers.wait import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def zygote(tmp_path):
    z = Zygote(ROLES, tmp_path, timeout_s=10).start()
    yield z
    z.stop()


def _report(child: Child) -> dict[str, str]:
    assert child.proc is not None and child.proc.stdout is not None
    line = child.proc.stdout.readline().decode()
    return dict(field.split("=", 1) for field in line.split())


def test_a_group_forks_with_its_leader_as_group_and_dies_whole(zygote, tmp_path):
    assert zygote.how == "fork"  # the test process runs no thread
    leader = Child(Launch("builder", "g0/b", SLEEP), zygote, tmp_path).start()
    members = [
        Child(Launch("worker", f"g0/w{i}", SLEEP), zygote, tmp_path, leader=leader).start()
        for i in range(4)
    ]
    group = [leader, *members]
    assert {os.getpgid(c.pid) for c in group} == {leader.pid}
    assert all(psutil.Process(c.pid).ppid() == zygote.pid for c in group)
    members[0].kill()  # a member alone, not its leader's group
    assert members[0].returncode == -signal.SIGKILL
    assert leader.alive() and all(m.alive() for m in members[1:])
    kill_all(group)
    assert [c.returncode for c in group] == [-signal.SIGKILL] * 5
    assert not any(psutil.pid_exists(c.pid) and psutil.Process(c.pid).status() != "zombie"
                   for c in group)  # fmt: skip


def test_exit_statuses_logs_and_restart(zygote, tmp_path):
    child = Child(Launch("worker", "w", EXIT, b"7"), zygote, tmp_path).start()
    assert child.proc is not None and child.proc.wait(10) == 7
    assert not child.alive() and child.returncode == 7
    crash = Child(Launch("worker", "c", EXIT, b"not a number"), zygote, tmp_path).start()
    assert crash.proc is not None and crash.proc.wait(10) == 1
    assert "ValueError" in crash.log_tail()  # the traceback went to its log
    assert oct(crash.log_path.stat().st_mode & 0o777) == "0o600"
    first = child.pid
    child.restart()
    assert child.proc is not None and child.proc.wait(10) == 7
    assert child.pid != first and child.starts == 2


def test_stop_asks_first_then_kills(zygote, tmp_path):
    child = Child(Launch("worker", "w", SLEEP), zygote, tmp_path).start()
    assert child.stop(5) is True  # SIGTERM ends a sleeper
    assert child.returncode == -signal.SIGTERM
    assert child.stop(5) is True  # idempotent


def test_children_die_with_a_killed_zygote_and_it_comes_back(zygote, tmp_path):
    child = Child(Launch("worker", "w", SLEEP), zygote, tmp_path).start()
    old = zygote.pid
    os.kill(old, signal.SIGKILL)
    assert child.proc is not None
    assert child.proc.wait(10) == -signal.SIGKILL  # PR_SET_PDEATHSIG from the zygote
    again = Child(Launch("worker", "w2", EXIT, b"0"), zygote, tmp_path).start()
    assert zygote.pid != old and again.proc is not None and again.proc.wait(10) == 0


def test_a_malformed_request_is_refused_and_the_zygote_serves_on(zygote, tmp_path):
    import socket

    assert zygote._sock is not None
    socket.send_fds(zygote._sock, [b"\xc1 not msgpack"], [])
    data, _, _, _ = socket.recv_fds(zygote._sock, 4096, 1)
    assert b"malformed" in data
    child = Child(Launch("worker", "w", EXIT, b"3"), zygote, tmp_path).start()
    assert child.proc is not None and child.proc.wait(10) == 3


def test_a_stopped_zygote_is_an_error_naming_it(zygote, tmp_path):
    child = Child(Launch("worker", "w", SLEEP), zygote, tmp_path).start()
    zygote.stop()
    assert child.proc is not None and child.proc.wait(10) == -signal.SIGKILL
    with pytest.raises(ZygoteError, match="stopped"):
        Child(Launch("worker", "late", SLEEP), zygote, tmp_path).start()


def test_spawn_and_fork_children_have_one_shape(tmp_path):
    spawned = Child(Launch("worker", "s", EXIT, b"5"), SpawnStarter(), tmp_path).start()
    assert spawned.proc is not None and spawned.proc.wait(60) == 5
    assert spawned.returncode == 5 and not spawned.alive()


# The coordinator's side, in a process of its own: ZeroMQ sockets, a thread and
# a held lock before and after the zygote starts; the child must hold none.
_COORDINATOR = textwrap.dedent(
    """
    import json, os, sys, tempfile, threading, pathlib
    import zmq
    from shardsink.process import Child, Launch, Zygote, kill_all
    from tests.helpers.roles import REPORT, ROLES

    before = sys.argv[1] == "before"
    run = pathlib.Path(tempfile.mkdtemp())
    held = []

    def open_things():
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.bind(f"ipc://{run}/s{len(held)}")
        lock = threading.Lock()
        lock.acquire()
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait, daemon=True)
        thread.start()
        held.append((ctx, sock, lock, stop, thread))

    if before:
        open_things()
    zygote = Zygote(ROLES, run).start()
    open_things()
    child = Child(Launch("worker", "w", REPORT, b"x", stdout="pipe"), zygote, run).start()
    line = child.proc.stdout.readline().decode()
    mine = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    print(json.dumps({"how": zygote.how, "child": line, "mine": mine}), flush=True)
    kill_all([child])
    zygote.stop()
    for ctx, sock, lock, stop, thread in held:
        stop.set()
        sock.close()
        ctx.term()
    """
)


@pytest.mark.parametrize("when", ["before", "after"])
def test_no_socket_thread_or_lock_of_the_coordinator_reaches_a_child(when, popen):
    import json

    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = popen(
        [sys.executable, "-c", _COORDINATOR, when],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)
    # threads and a context before the zygote: it cannot be forked, it is exec'd
    assert result["how"] == ("spawn" if when == "before" else "fork")
    report = dict(field.split("=", 1) for field in result["child"].split())
    assert report["threads"] == "1" and report["python_threads"] == "1"
    # stdin, stdout, stderr and the descriptor listdir itself opens: nothing else
    assert report["fds"] == "0,1,2,3"
    assert len(result["mine"]) > 6  # the coordinator did hold sockets


def test_a_coordinator_killed_takes_its_zygote_and_children_along(popen, tmp_path):
    script = textwrap.dedent(
        f"""
        import pathlib, sys, time
        from shardsink.process import Child, Launch, Zygote
        from tests.helpers.roles import ROLES, SLEEP
        run = pathlib.Path({str(tmp_path)!r})
        zygote = Zygote(ROLES, run).start()
        kids = [Child(Launch("worker", f"w{{i}}", SLEEP), zygote, run).start() for i in range(3)]
        print(zygote.pid, *[k.pid for k in kids], flush=True)
        time.sleep(60)  # to be killed: its zygote and children must die with it
        """
    )
    proc = popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": ROOT},
        cwd=ROOT,
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 4
    proc.kill()
    proc.wait(10)

    def live() -> list[int]:
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]

    wait_until(lambda: not live(), 10, lambda: f"the end of what outlived the coordinator {live()}")
