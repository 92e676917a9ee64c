"""Per-process logs: where a child's log is, how logs outlive a run, how they stay bounded.

A child's log is ``NAME.log`` (``/`` in the name spelled ``-``) in its run
directory's ``logs/`` (:func:`log_dir`; a directory without one holds the
logs itself). A run directory made with ``keep`` (:func:`~.rundir.make_run_dir`)
has ``logs/`` link to a fresh directory under ``keep`` (a data dir's
``logs/``): ``STAMP-CLUSTER`` (UTC, so names sort by start), so the logs
outlive the run; at most :data:`KEEP_RUNS` such runs are kept, the oldest
removed first. A log past :data:`MAX_BYTES` is rotated by :func:`rotate`:
copied to ``NAME.log.1`` (replacing the one before) and truncated. Children
append (``O_APPEND``), so they write on at the start of the truncated file;
a line written between the copy and the truncation is lost, the price of
rotating a file other processes hold open.

The parent writes a line of its own, starting ``[shardsink``, when a child
starts and when it is seen to exit (:func:`note`), so a child killed before
it wrote anything still has a log that says what happened to it.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from .._units import MIB

LOGS = "logs"
SUFFIX = ".log"
ROTATED = ".log.1"
#: Runs whose logs a data dir keeps.
KEEP_RUNS = 10
#: A log is rotated past this size, so one process keeps at most twice it.
MAX_BYTES = 8 * MIB
#: How often a :class:`Rotator` looks at the logs.
ROTATE_EVERY_S = 5.0
#: Written in a kept run's directory when its cluster has closed.
ENDED = "_ended"


def log_dir(run_dir: Path) -> Path:
    """Where the children started in ``run_dir`` log (see the module doc;
    the kept directory itself, so a log is found after the run directory is gone)."""
    logs = run_dir / LOGS
    return logs.resolve() if logs.is_dir() else run_dir


def log_file(run_dir: Path, name: str) -> Path:
    """The log of the child named ``name`` started in ``run_dir``."""
    return log_dir(run_dir) / file_name(name)


def file_name(name: str) -> str:
    """The file name of process ``name``'s log."""
    return name.replace("/", "-") + SUFFIX


def new_kept(keep: Path, cluster_id: str, now: float | None = None) -> Path:
    """A fresh 0700 directory under ``keep`` (made 0700 if missing) for the
    logs of cluster ``cluster_id``'s run, removing the oldest runs beyond
    :data:`KEEP_RUNS`."""
    keep.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    path = keep / f"{stamp}-{cluster_id}"
    path.mkdir(mode=0o700)
    for old in runs(keep)[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def runs(keep: Path) -> list[Path]:
    """The kept runs' log directories under ``keep``, oldest first."""
    try:
        return sorted(p for p in keep.iterdir() if p.is_dir() and not p.is_symlink())
    except FileNotFoundError:
        return []


def end(run_logs: Path) -> None:
    """Mark a kept run's logs as complete: its cluster has closed. The mark
    is 0600, as every log beside it."""
    os.close(os.open(run_logs / ENDED, os.O_WRONLY | os.O_CREAT, 0o600))


def ended(run_logs: Path) -> bool:
    return (run_logs / ENDED).exists()


def rotate(path: Path, max_bytes: int = MAX_BYTES) -> bool:
    """Rotate the log ``path`` if it is past ``max_bytes`` (see the module
    doc); whether it did."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
        shutil.copyfile(path, path.with_name(path.name[: -len(SUFFIX)] + ROTATED))
        os.truncate(path, 0)
    except FileNotFoundError:
        return False
    return True


def rotate_all(directory: Path, max_bytes: int = MAX_BYTES) -> list[Path]:
    """Rotate every log in ``directory`` past ``max_bytes``; those rotated."""
    return [p for p in sorted(directory.glob(f"*{SUFFIX}")) if rotate(p, max_bytes)]


class Rotator:
    """Called often (a coordinator's poll), rotates the logs of ``directory``
    past :data:`MAX_BYTES` at most every :data:`ROTATE_EVERY_S`."""

    def __init__(self, directory: Path, every_s: float = ROTATE_EVERY_S) -> None:
        self.directory = directory
        self.every_s = every_s
        self._last = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            rotate_all(self.directory)


def note(path: Path, text: str) -> None:
    """Append the parent's line ``text`` (UTC-stamped) to the log ``path``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return  # a log removed with its run directory: nothing to say it in
    try:
        os.write(fd, f"[shardsink {stamp} UTC] {text}\n".encode())
    finally:
        os.close(fd)


def exit_words(returncode: int) -> str:
    """How a process ended, in words: ``exited with status 2``,
    ``killed by signal 9 (SIGKILL)``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"killed by signal {-returncode}{name}"
