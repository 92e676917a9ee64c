"""Segment names, and removal of segments whose creator is gone.

Every segment is named ``shardsink.<cluster>.<pid>.<start>.<n>``: the cluster
id, the creating process's pid and start time (clock ticks since boot, from
``/proc/<pid>/stat``), and a counter private to that process. The start time
makes liveness exact: a pid recycled by an unrelated process does not keep a
dead worker's segments alive. A creator that is a zombie counts as dead.

Only this user's segments with names of this exact form are ever touched;
anything else under ``/dev/shm``, including other ``shardsink*`` names, is left
alone.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import posix_ipc

from .._pids import process_start

SHM_DIR = Path("/dev/shm")
PREFIX = "shardsink"
_CLUSTER = r"[A-Za-z0-9_-]{1,40}"
_CLUSTER_RE = re.compile(_CLUSTER)
_NAME_RE = re.compile(rf"{PREFIX}\.({_CLUSTER})\.([1-9][0-9]*)\.([0-9]+)\.([0-9]+)")
_counter = itertools.count()


def check_cluster_id(cluster: str) -> str:
    """Return ``cluster`` if it is a valid cluster id (1-40 of ``A-Za-z0-9_-``),
    else raise ``ValueError`` naming it."""
    if not isinstance(cluster, str) or not _CLUSTER_RE.fullmatch(cluster):
        raise ValueError(f"invalid cluster id {cluster!r}: use 1 to 40 of A-Z a-z 0-9 _ -")
    return cluster


@dataclass(frozen=True, slots=True)
class SegmentName:
    """The parts of a segment name; ``str()`` gives the name as listed in /dev/shm."""

    cluster: str
    pid: int
    start: int
    n: int

    def __str__(self) -> str:
        return f"{PREFIX}.{self.cluster}.{self.pid}.{self.start}.{self.n}"

    @property
    def ipc_name(self) -> str:
        """The name as ``posix_ipc`` takes it (with the leading slash)."""
        return f"/{self}"

    @classmethod
    def parse(cls, name: str) -> SegmentName:
        """Parse a segment name (with or without the leading slash); ``ValueError``
        if it is not one shardsink creates."""
        match = _NAME_RE.fullmatch(name.removeprefix("/")) if isinstance(name, str) else None
        if match is None:
            raise ValueError(f"{name!r} is not a shardsink segment name")
        cluster, pid, start, n = match.groups()
        return cls(cluster, int(pid), int(start), int(n))

    @classmethod
    def fresh(cls, cluster: str) -> SegmentName:
        """A name no segment of this process has had before."""
        pid = os.getpid()
        start = process_start(pid)
        if start is None:  # only if /proc is missing, where shardsink cannot run
            raise RuntimeError(f"cannot read the start time of this process from /proc/{pid}")
        return cls(check_cluster_id(cluster), pid, start, next(_counter))


def creator_alive(name: SegmentName) -> bool:
    """Whether the process that created the segment ``name`` is still running."""
    return process_start(name.pid) == name.start


def list_segments(cluster: str | None = None) -> list[SegmentName]:
    """This user's shardsink segments in /dev/shm (of ``cluster`` only, if
    given), sorted."""
    if cluster is not None:
        check_cluster_id(cluster)
    found = []
    try:
        entries = list(os.scandir(SHM_DIR))
    except FileNotFoundError:
        return []
    for entry in entries:
        try:
            name = SegmentName.parse(entry.name)
            if entry.stat().st_uid != os.geteuid():
                continue
        except (ValueError, FileNotFoundError):  # not ours, or unlinked meanwhile
            continue
        if cluster is None or name.cluster == cluster:
            found.append(name)
    return sorted(found, key=lambda s: (s.cluster, s.pid, s.start, s.n))


def unlink_segment(name: SegmentName) -> bool:
    """Unlink one segment; ``False`` if it was already gone. Processes that have
    it mapped keep their mapping until they unmap it."""
    try:
        posix_ipc.unlink_shared_memory(name.ipc_name)
    except posix_ipc.ExistentialError:
        return False
    return True


def sweep(cluster: str | None = None, *, dry_run: bool = False) -> list[str]:
    """Unlink every segment whose creator is dead (of ``cluster`` only, if given).

    Safe to run while clusters are live: a live creator's segments are never
    touched. Returns the names removed (or, with ``dry_run``, that would be).
    """
    dead = [name for name in list_segments(cluster) if not creator_alive(name)]
    if dry_run:
        return [str(name) for name in dead]
    return [str(name) for name in dead if unlink_segment(name)]


def unlink_cluster(cluster: str, *, dry_run: bool = False) -> list[str]:
    """Unlink every segment of ``cluster``, live creators or not: the cluster's
    own clean-up at exit. Returns the names removed (or that would be)."""
    names = list_segments(cluster)
    if dry_run:
        return [str(name) for name in names]
    return [str(name) for name in names if unlink_segment(name)]
