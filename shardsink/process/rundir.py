"""Run directories: a fresh 0700 directory per cluster run for its sockets and
logs, owned by the process that made it, removed once that owner is gone
(the logs in its ``logs/``, which may outlive it: :mod:`.logs`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from .._pids import process_start
from . import logs

_RUN_PREFIX = "shardsink-run-"
_OWNER = "coordinator"


def make_run_dir(cluster_id: str, keep_logs: Path | None = None) -> Path:
    """A fresh 0700 directory for the cluster's sockets and logs, recording
    this process as its owner; directories of dead owners are removed first.
    Its ``logs/`` is its own, or with ``keep_logs`` a link to a fresh
    directory there that outlives it (:func:`.logs.new_kept`)."""
    remove_dead_run_dirs()
    path = Path(tempfile.mkdtemp(prefix=f"{_RUN_PREFIX}{cluster_id}-"))
    pid = os.getpid()
    (path / _OWNER).write_text(f"{pid} {process_start(pid)}")
    if keep_logs is None:
        (path / logs.LOGS).mkdir(mode=0o700)
    else:
        (path / logs.LOGS).symlink_to(logs.new_kept(keep_logs, cluster_id))
    return path


def remove_dead_run_dirs() -> list[Path]:
    """Remove this user's run directories whose owner is gone."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{_RUN_PREFIX}*"):
        try:
            if path.stat().st_uid != os.geteuid() or _owner_alive(path):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _owner_alive(path: Path) -> bool:
    try:
        pid, start = (path / _OWNER).read_text().split()
        return str(process_start(int(pid))) == start  # a zombie or reused pid: gone
    except FileNotFoundError:
        # mkdtemp ran but the owner file is not written yet: a coordinator starting
        return time.time() - path.stat().st_mtime < 60
    except ValueError:
        return False
