"""Range checks of config Structs' fields, each a ``ValueError`` naming the
field, its bound and its value (the same words in every config), and what
this machine has room for (:func:`this_machine`), which a cluster's shape is
checked against before anything starts (:func:`shardsink.config.check_machine`)."""

from __future__ import annotations

import os
import resource
from typing import NamedTuple

import pyarrow as pa

#: The largest TCP port.
MAX_PORT = 65535


def at_least(config: object, least: int, *names: str, prefix: str = "") -> None:
    """``ValueError`` for the first of ``names`` whose value is below ``least``."""
    for name in names:
        value = getattr(config, name)
        if value < least:
            raise ValueError(f"{prefix}{name} must be >= {least}, got {value}")


def positive(config: object, *names: str, prefix: str = "") -> None:
    """``ValueError`` for the first of ``names`` whose value is not above 0."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ValueError(f"{prefix}{name} must be > 0, got {value}")


def port(config: object, name: str) -> None:
    """``ValueError`` unless field ``name`` is ``None`` or a port (0: any free one)."""
    value = getattr(config, name)
    if value is not None and not 0 <= value <= MAX_PORT:
        raise ValueError(f"{name} must be 0 to {MAX_PORT}, got {value}")


class Machine(NamedTuple):
    """What this machine has room for, as :func:`this_machine` reads it:
    ``cpus`` this process may run on; ``memory_bytes`` available (the
    kernel's ``MemAvailable``, or the room left in this process's memory
    cgroup if less); ``tasks_free`` more tasks (processes and threads alike)
    that may start before ``tasks_limit`` (in words, the tightest of ``ulimit
    -u``, ``kernel.pid_max``, ``kernel.threads-max`` and the cgroup's
    ``pids.max``) is reached; ``fds``, the descriptors one process may open
    (``ulimit -n``); ``shm_bytes``, free in ``/dev/shm``."""

    cpus: int
    memory_bytes: int
    tasks_free: int
    tasks_limit: str
    fds: int
    shm_bytes: int


def this_machine() -> Machine:
    """This machine's :class:`Machine`, read from ``/proc``, ``/sys`` and the
    resource limits (a few milliseconds: no process is started)."""
    tasks = int(_read("/proc/loadavg").split()[3].split("/")[1])  # every task now
    limits = [
        (_int_file("/proc/sys/kernel/pid_max") - tasks, "kernel.pid_max"),
        (_int_file("/proc/sys/kernel/threads-max") - tasks, "kernel.threads-max"),
    ]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if os.geteuid() != 0 and nproc != resource.RLIM_INFINITY:  # root is not held to it
        limits.append((nproc - _own_tasks(), f"ulimit -u {nproc}"))
    pids = _cgroup_room("pids.max", "pids.current")
    if pids is not None:
        limits.append((pids, "the cgroup's pids.max"))
    free, limit = min(limits)
    memory = _meminfo("MemAvailable")
    room = _cgroup_room("memory.max", "memory.current") or _cgroup_room(
        "memory.limit_in_bytes", "memory.usage_in_bytes", v1="memory"
    )
    try:
        shm = os.statvfs("/dev/shm")
        shm_bytes = shm.f_bavail * shm.f_frsize
    except OSError:  # no POSIX shared memory at all
        shm_bytes = 0
    return Machine(
        cpus=len(os.sched_getaffinity(0)) or 1,
        memory_bytes=memory if room is None else min(memory, room),
        tasks_free=max(free, 0),
        tasks_limit=limit,
        fds=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        shm_bytes=shm_bytes,
    )


def min_row_bytes(schema: pa.Schema) -> float:
    """The fewest bytes a row of ``schema`` takes in Arrow memory: each
    fixed-width field's width, each variable-width one's offset (its values
    may be empty), nothing for validity."""
    total = 0.0
    for field in schema:
        try:
            total += field.type.bit_width / 8
        except ValueError:  # variable width, or nested: at least an offset (or its children)
            total += _nested_bytes(field.type)
    return total


def _nested_bytes(kind: pa.DataType) -> float:
    if pa.types.is_struct(kind):
        return min_row_bytes(pa.schema(list(kind)))
    return 8 if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind) else 4


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _int_file(path: str) -> int:
    return int(_read(path).strip())


def _meminfo(key: str) -> int:
    for line in _read("/proc/meminfo").splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0]) * 1024
    raise ValueError(f"/proc/meminfo has no {key}")


def _own_tasks() -> int:
    """The tasks of this process's user (what ``ulimit -u`` counts)."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                count += len(os.listdir(f"/proc/{entry.name}/task"))
        except OSError:  # gone meanwhile
            continue
    return count


def _cgroup_room(limit: str, usage: str, v1: str = "") -> int | None:
    """``limit`` minus ``usage`` of this process's cgroup (v2, or with
    ``v1`` the v1 hierarchy of that controller); ``None`` where there is no
    limit or no such file."""
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1 and v1 in controllers.split(",")) or (not v1 and not controllers):
            base = f"/sys/fs/cgroup/{v1}{path}".replace("//", "/")
            try:
                most, used = _read(f"{base}/{limit}").strip(), _int_file(f"{base}/{usage}")
            except (OSError, ValueError):
                return None
            # "max", or v1's "no limit" (a page-rounded 2**63 - 1)
            return None if most == "max" or int(most) >= 1 << 62 else int(most) - used
    return None
