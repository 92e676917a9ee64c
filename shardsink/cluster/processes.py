"""Process lifecycle of a cluster: the run directory, launching children in
process groups, killing and reaping them, and their peak memory.

Every child is a fresh interpreter (``python -m shardsink.cluster.child``),
started with ``subprocess`` (fork+exec, no Python code runs between them), so
no thread or ZeroMQ context of the coordinator is ever inherited. A spawn costs
about 0.6 s of CPU (imports); children start in parallel. Each child sets
``PR_SET_PDEATHSIG`` itself, so it dies with the coordinator; its stderr goes to
a log file in the run directory, whose tail is quoted when it dies unexpectedly.

Only pids this module started are ever signalled: a group is killed with
``killpg`` only while one of its members is still unreaped (so the group id
cannot have been reused), and every member is reaped here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..shm.sweep import process_start

log = logging.getLogger(__name__)

#: Environment of every child: one BLAS thread (workers do no linear algebra).
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
#: Children import shardsink from where the coordinator did, whatever their cwd.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_RUN_PREFIX = "shardsink-run-"
_OWNER = "coordinator"


def make_run_dir(cluster_id: str) -> Path:
    """A fresh 0700 directory for the cluster's sockets and logs, recording
    this process as its owner; directories of dead owners are removed first."""
    remove_dead_run_dirs()
    path = Path(tempfile.mkdtemp(prefix=f"{_RUN_PREFIX}{cluster_id}-"))
    pid = os.getpid()
    (path / _OWNER).write_text(f"{pid} {process_start(pid)}")
    return path


def remove_dead_run_dirs() -> list[Path]:
    """Remove this user's run directories whose coordinator is gone."""
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


@dataclass
class Child:
    """A started child process: ``kind`` is consensus, builder or worker."""

    kind: str
    name: str
    proc: subprocess.Popen
    log_path: Path
    pgid: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        """Whether it is still running (reaps it if it exited)."""
        return self.proc.poll() is None

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""


def spawn(
    kind: str,
    name: str,
    args: list[str],
    *,
    run_dir: Path,
    stdin: bytes | None = None,
    process_group: int = 0,
    stdout: int | None = None,
    env: dict[str, str] | None = None,
) -> Child:
    """Start ``python -m shardsink.cluster.child <my pid> <args>`` in process
    group ``process_group`` (0: a new group led by the child), with ``stdin``
    written to its standard input, stderr to ``run_dir/<name>.log`` and
    ``env`` added to its environment."""
    log_path = run_dir / f"{name.replace('/', '-')}.log"
    argv = [sys.executable, "-m", "shardsink.cluster.child", str(os.getpid()), *args]
    with open(log_path, "ab") as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=stdout if stdout is not None else err,
            stderr=err,
            process_group=process_group,
            env={**_child_env(), **(env or {})},
        )
    if stdin is not None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:  # it died at once; the supervisor will see it
            pass
    return Child(kind, name, proc, log_path, process_group or proc.pid)


def _child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        **CHILD_ENV,
        "PYTHONPATH": _PACKAGE_ROOT if not path else f"{_PACKAGE_ROOT}{os.pathsep}{path}",
    }


def kill_all(children: list[Child], timeout_s: float = 10.0) -> None:
    """SIGKILL ``children`` (their process groups first) and reap them all."""
    live = [c for c in children if c.proc.returncode is None]
    # An unreaped member holds the group id, so killpg cannot hit a reused one.
    for pgid in {c.pgid for c in live}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for child in live:
        child.proc.kill()
    reap(live, timeout_s)


def stop(child: Child, sig: int, grace_s: float) -> bool:
    """Send ``sig`` to ``child`` if it is alive and reap it; SIGKILL it after
    ``grace_s``. Whether it exited by itself (a dead child: True)."""
    if child.proc.poll() is None:
        child.proc.send_signal(sig)
    try:
        reap([child], grace_s)
    except TimeoutError:
        kill_all([child])
        return False
    return True


def reap(children: list[Child], timeout_s: float) -> None:
    """Wait for ``children`` to exit (``TimeoutError`` naming the stragglers)."""
    deadline = time.monotonic() + timeout_s
    stuck = []
    for child in children:
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stuck.append(f"{child.name} (pid {child.pid})")
        for stream in (child.proc.stdin, child.proc.stdout):
            if stream is not None:
                stream.close()
    if stuck:
        raise TimeoutError(f"processes did not exit within {timeout_s}s: {', '.join(stuck)}")


def reset_own_peak_rss() -> bool:
    """Restart this process's peak-RSS count (``VmHWM``) from its current
    RSS, so that one phase can be measured apart; ``False`` if the kernel
    does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def marked(name: str, value: str) -> dict[int, str]:
    """Live processes (zombies aside) whose environment holds ``name=value``,
    by pid, with their command lines. A mark set in a child's environment is
    inherited by everything it starts, so this finds its descendants even
    after they were orphaned and re-parented."""
    out = {}
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):  # gone, or not ours to read
            if process.environ().get(name) == value and process.status() != psutil.STATUS_ZOMBIE:
                out[process.pid] = " ".join(process.cmdline()) or process.name()
    return out


def peak_rss(pid: int) -> int | None:
    """Peak resident bytes of a live process (``VmHWM``), or ``None`` if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return None
