"""Start a child as a fresh interpreter: ``python -m shardsink.process PARENT
spawn ROLE``.

``subprocess`` forks and execs at once (no Python code runs in between), so
nothing of the parent's threads, sockets or locks reaches the child; the price
is that every child imports its libraries again (about 0.5 s of CPU and
~130 MiB of private pages for pyarrow, numpy and pyzmq). The payload goes on
stdin, so no secret is ever in argv. This is ``--start spawn`` and the
zygote's own start when the parent cannot fork safely.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from .child import Launch, Running
from .parent import parent_token

#: The module every child runs (``python -m``; see :mod:`.entry`).
ENTRY = "shardsink.process"
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


def entry_argv(*args: str) -> list[str]:
    """The argv that runs :data:`ENTRY` with ``args`` as a child of this process."""
    return [sys.executable, "-m", ENTRY, parent_token(), *args]


class SpawnStarter:
    """Starts launches as fresh interpreters (see :mod:`.entry`), each
    importing its role."""

    name = "spawn"

    def __init__(self, popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> None:
        #: what starts the interpreter: ``subprocess.Popen``'s signature, and
        #: another host's (an emulated one's) where the child runs elsewhere
        self._popen = popen

    def run(self, launch: Launch, *, log_path: Path, pgid: int) -> Running:
        with open(log_path, "ab") as err, _stdout(launch.stdout, err) as out:
            os.fchmod(err.fileno(), 0o600)
            proc = self._popen(
                entry_argv("spawn", launch.role),
                stdin=subprocess.PIPE,
                stdout=out,
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


@contextlib.contextmanager
def _stdout(where: str, log: IO[bytes]) -> Iterator[int | IO[bytes]]:
    """What ``Popen`` takes as stdout for a :class:`Launch`'s ``stdout``."""
    if where == "log":
        yield log
    elif where == "pipe":
        yield subprocess.PIPE
    elif where == "null":
        yield subprocess.DEVNULL
    else:
        with open(where, "ab") as out:
            yield out
