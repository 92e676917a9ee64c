"""The zygote's replies: each goes to the request it answers (a late one to
none), no descriptor that comes with one is left open, and children are
waited on whatever the number of their pidfd.

A late reply is made by stopping the zygote (SIGSTOP) while a request waits
for it: the request times out, and the zygote answers it once continued."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from collections.abc import Iterator

import psutil
import pytest

from shardsink.process import Child, Launch, Zygote, ZygoteError, kill_all
from tests.helpers.roles import EXIT, ROLES, SLEEP
from tests.helpers.wait import wait_until

#: Short enough that a stalled request gives up soon, long enough for a fork
#: on a busy machine.
TIMEOUT_S = 2.0


@pytest.fixture
def zygote(tmp_path):
    z = Zygote(ROLES, tmp_path, timeout_s=TIMEOUT_S).start()
    yield z
    z.stop()


@contextlib.contextmanager
def _stalled(zygote: Zygote) -> Iterator[None]:
    """The zygote stopped inside the block: what is asked there is read, and
    answered, only after it (the zygote is continued on the way out)."""
    assert zygote.how == "fork"  # a direct child: its pid is not reused while unreaped
    os.kill(zygote.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(zygote.pid, signal.SIGCONT)


def _open_fds() -> dict[int, str]:
    """This process's descriptors and what each points at."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # listdir's own descriptor, closed by now
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return out


def test_a_late_reply_is_nobodys_and_does_not_shift_the_next(zygote, tmp_path):
    sleeper = Child(Launch("worker", "s", SLEEP), zygote, tmp_path).start()
    with _stalled(zygote), pytest.raises(ZygoteError, match="did not answer"):
        Child(Launch("worker", "late", SLEEP), zygote, tmp_path).start()
    # The zygote now forks "late" and answers that fork; the answer reaches the
    # client while it waits for this reap's, and must not be taken for it.
    assert zygote.reap(sleeper.pid) is None
    child = Child(Launch("worker", "w", EXIT, b"7"), zygote, tmp_path).start()
    assert child.proc is not None and child.proc.wait(10) == 7

    # Nobody tracks the late fork's child: it is killed, and reaped on a later request.
    def others() -> list[int]:
        return [p.pid for p in psutil.Process(zygote.pid).children() if p.pid != sleeper.pid]

    def reaped() -> bool:
        if not others():
            return True
        assert zygote.reap(sleeper.pid) is None  # a request, on which the zygote reaps
        return False

    wait_until(reaped, 10, lambda: f"the reaping of the late fork's child {others()}", every_s=0.02)
    assert sleeper.alive()
    kill_all([sleeper])
    assert sleeper.returncode == -signal.SIGKILL


def test_fork_and_reap_cycles_leave_no_descriptor_open(zygote, tmp_path):
    def cycle(i: int) -> None:
        child = Child(Launch("worker", f"w{i}", EXIT, b"0"), zygote, tmp_path).start()
        assert child.proc is not None and child.proc.wait(10) == 0

    cycle(0)  # anything opened once, lazily, is open before the count
    before = _open_fds()
    errors: list[ZygoteError] = []
    for i in range(1, 61):
        if i in (10, 30):  # a fork answered late: its pidfd comes with nobody's reply
            with _stalled(zygote), pytest.raises(ZygoteError, match="did not answer"):
                Child(Launch("worker", f"late{i}", EXIT, b"0"), zygote, tmp_path).start()
        try:
            cycle(i)
        except ZygoteError as exc:  # counted below, after the descriptors
            errors.append(exc)

    # a late fork's child is reaped (its pidfd closed) on a request after it died
    def left() -> dict[int, str]:
        return {fd: what for fd, what in _open_fds().items() if before.get(fd) != what}

    def closed() -> bool:
        if not left():
            return True
        with contextlib.suppress(ZygoteError):  # a request, on which the zygote reaps
            cycle(100)
        return False

    wait_until(closed, 10, lambda: f"the closing of descriptors left open {left()}", every_s=0.02)
    assert not errors, errors


def test_a_child_whose_pidfd_is_above_1023_is_polled_and_waited_on(zygote, tmp_path):
    need = 1100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    fillers = [os.open(os.devnull, os.O_RDONLY)]
    try:
        # every descriptor up to 1023 taken, so the kernel gives the pidfd one above
        while fillers[-1] < 1023:
            fillers.append(os.dup(fillers[0]))
        child = Child(Launch("worker", "s", SLEEP), zygote, tmp_path).start()
        proc = child.proc
        assert proc is not None and proc._pidfd is not None and proc._pidfd >= 1024
        assert proc.poll() is None and child.alive()
        with pytest.raises(TimeoutError):
            proc.wait(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM
        assert proc.poll() == -signal.SIGTERM and not child.alive()
        exiting = Child(Launch("worker", "e", EXIT, b"4"), zygote, tmp_path).start()
        assert exiting.wait(10) == 4
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_refusal_names_the_request_it_refuses(zygote, tmp_path):
    import socket

    import msgspec

    from shardsink.process.zygote_messages import Refused, decode_reply

    assert zygote._sock is not None  # a client sending what this one never would
    bad = msgspec.msgpack.encode({"type": "Fork", "id": 12345, "launch": "not a launch"})
    socket.send_fds(zygote._sock, [bad], [])
    data, _, _, _ = socket.recv_fds(zygote._sock, 4096, 1)
    reply = decode_reply(data)
    assert isinstance(reply, Refused) and reply.id == 12345 and "malformed" in reply.reason
    # a refusal of a request without a readable id, left unread, is nobody's either
    socket.send_fds(zygote._sock, [b"\xc1 not msgpack"], [])
    child = Child(Launch("worker", "w", EXIT, b"3"), zygote, tmp_path).start()
    assert child.proc is not None and child.proc.wait(10) == 3
