"""Trivial roles, for tests of the process layer: each constant names its
function as a role (``module:function``)."""

from __future__ import annotations

import os
import sys
import threading
import time

SLEEP = "tests.helpers.roles:sleep"
REPORT = "tests.helpers.roles:report"
EXIT = "tests.helpers.roles:exit_with"
TELL = "tests.helpers.roles:tell"
#: What the tests' zygotes import before they fork.
ROLES = (SLEEP, REPORT, EXIT, TELL)


def sleep(payload: bytes) -> int:
    time.sleep(float(payload or b"30"))  # the role: a child that runs until stopped or killed
    return 0


def report(payload: bytes) -> int:
    """Print what this process holds: its pid, pgid, open fds, threads, env mark."""
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    print(
        f"pid={os.getpid()} pgid={os.getpgid(0)} fds={','.join(map(str, fds))} threads={threads} "
        f"python_threads={threading.active_count()} payload={payload.decode()} "
        f"mark={os.environ.get('ROLE_MARK', '')}",
        flush=True,
    )
    sys.stderr.write("reported\n")
    time.sleep(30)  # stays, so that what it reported is still held when looked at
    return 0


def exit_with(payload: bytes) -> int:
    return int(payload)


def tell(payload: bytes) -> int:
    """Take the channel to the parent, print on stdout (which now goes to
    the log), then tell the parent it is ready at ``payload``."""
    from shardsink.process import ParentChannel, Ready

    channel = ParentChannel()
    print("listening on nothing: this line is for the log", flush=True)
    channel.tell(Ready(address=payload.decode()))
    time.sleep(30)  # stays ready until stopped, as a real server would
    return 0
