"""An entry module with trivial roles, for tests of the process layer."""

from __future__ import annotations

import os
import sys
import threading
import time

from shardsink.process import entry


def _sleep(payload: bytes) -> int:
    time.sleep(float(payload or b"30"))
    return 0


def _report(payload: bytes) -> int:
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
    time.sleep(30)
    return 0


def _exit(payload: bytes) -> int:
    return int(payload)


ROLES = {"sleep": _sleep, "report": _report, "exit": _exit}

if __name__ == "__main__":
    sys.exit(entry.main(ROLES, sys.argv[1:]))
