"""Start a child as a fresh interpreter: ``python -m ENTRY PARENT spawn ROLE``.

``subprocess`` forks and execs at once (no Python code runs in between), so
nothing of the parent's threads, sockets or locks reaches the child; the price
is that every child imports its libraries again (about 0.5 s of CPU and
~130 MiB of private pages for pyarrow, numpy and pyzmq). The payload goes on
stdin, so no secret is ever in argv. This is ``--start spawn`` and the
zygote's own start when the parent cannot fork safely.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .child import Launch, Running

#: Environment of every child: one BLAS thread (children do no linear algebra).
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
#: Children import shardsink from where the parent did, whatever their cwd.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment with :data:`CHILD_ENV`, shardsink importable,
    and ``extra``."""
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        **CHILD_ENV,
        "PYTHONPATH": _PACKAGE_ROOT if not path else f"{_PACKAGE_ROOT}{os.pathsep}{path}",
        **(extra or {}),
    }


def entry_argv(entry: str, *args: str) -> list[str]:
    """The argv that runs entry module ``entry`` as a child of this process."""
    return [sys.executable, "-m", entry, str(os.getpid()), *args]


class SpawnStarter:
    """Starts launches as fresh interpreters running ``entry``'s roles (see
    :func:`shardsink.process.entry.main`)."""

    name = "spawn"

    def __init__(self, entry: str) -> None:
        self.entry = entry

    def run(self, launch: Launch, *, log_path: Path, pgid: int) -> Running:
        with open(log_path, "ab") as err:
            os.fchmod(err.fileno(), 0o600)
            proc = subprocess.Popen(
                entry_argv(self.entry, "spawn", launch.role),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if launch.capture_stdout else err,
                stderr=err,
                process_group=pgid,
                env=child_env(launch.env),
            )
        assert proc.stdin is not None
        try:
            proc.stdin.write(launch.payload)
        except BrokenPipeError:  # it died at once; its supervisor will see it
            pass
        finally:
            proc.stdin.close()
            proc.stdin = None
        return proc
