"""Process identity: a pid plus its start time names one process for good.

A pid alone is reused once its process is reaped; the pair ``(pid, start)``,
with the start in clock ticks since boot from ``/proc/<pid>/stat``, is not.
Every liveness check of a process shardsink did not reap itself (segment
creators, run-directory owners, data-dir lock holders, chaos's stragglers)
goes through :func:`process_start`. A zombie counts as gone.
"""

from __future__ import annotations

from pathlib import Path


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot; ``None`` if there
    is no such process or it is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after it do not.
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])
