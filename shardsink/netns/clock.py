"""Wall-clock skew of a host's processes, through libfaketime.

A network namespace does not hold a clock (a time namespace shifts only the
monotonic and boot clocks), so a host's wall clock is skewed in its
processes: each is started with libfaketime ``LD_PRELOAD``-ed and pointed at
the host's offset file, which it reads again at every clock call
(``FAKETIME_NO_CACHE``), so rewriting the file moves the clock of every
running process of the host at once. The monotonic clock is left alone
(``FAKETIME_DONT_FAKE_MONOTONIC``): an offset moved back would run it
backwards.

Every process libfaketime starts in would make a semaphore and a shared
memory object of its own (``/dev/shm/sem.faketime_sem_<pid>``,
``faketime_shm_<pid>``, for its start-at and speed modes) and leave them
behind when it dies; this library version has no switch to turn that off.
So the run makes one pair of its own, named after the run, hands it to
every process (``FAKETIME_SHARED``: a process given one uses it and makes
none) and removes it at :meth:`Clocks.close` (:func:`.sweep.sweep` removes a
dead run's).

Limits: only dynamically linked programs that read the clock through libc
see the skew (not Go binaries, not statically linked ones); reading the file
costs every ``time.time()`` 2.8 us instead of 0.11 (100,000 calls in a
``python -c`` loop, with and without the preload).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import posix_ipc

from . import tools

#: What libfaketime maps of its shared object (a struct of a few counters
#: and times, zeros to start with): a page, more than it takes.
SHARED_BYTES = 4096


def shared_names(run: str) -> tuple[str, str]:
    """The semaphore and shared memory object a run's clocks share."""
    return f"/{run}-faketime-sem", f"/{run}-faketime-shm"


class Clocks:
    """The offset files of hosts ``names`` in ``directory``, each at 0 s
    until :meth:`set`, and the libfaketime state of run ``run`` (see the
    module doc). ``MissingCapability`` if libfaketime is missing
    (:func:`.tools.libfaketime`)."""

    def __init__(self, directory: Path, names: Iterable[str], run: str) -> None:
        self.library = tools.libfaketime()
        self._files = {name: directory / f"clock-{name}" for name in names}
        self._offsets: dict[str, float] = {}
        self._run = run
        self._shared = shared_names(run)
        semaphore, memory = self._shared
        posix_ipc.Semaphore(semaphore, posix_ipc.O_CREX, mode=0o600, initial_value=1).close()
        posix_ipc.SharedMemory(memory, posix_ipc.O_CREX, mode=0o600, size=SHARED_BYTES).close_fd()
        for name in self._files:
            self.set(name, 0.0)

    def environ(self, name: str, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` plus what makes a process started with it follow host
        ``name``'s clock (libfaketime goes first in ``LD_PRELOAD``)."""
        preload = " ".join(filter(None, [self.library, base.get("LD_PRELOAD", "")]))
        return {
            **base,
            "LD_PRELOAD": preload,
            "FAKETIME_TIMESTAMP_FILE": str(self._files[name]),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_SHARED": " ".join(self._shared),
        }

    def set(self, name: str, seconds: float) -> None:
        """Set host ``name``'s wall clock ``seconds`` ahead of the real one
        (behind if negative), for its running processes too."""
        path = self._files[name]
        temporary = path.with_suffix(".new")
        # libfaketime's relative form; written aside and renamed, so that a
        # process reading it at any instant sees the old offset or the new one.
        temporary.write_text(f"{seconds:+.6f}\n")
        os.replace(temporary, path)
        self._offsets[name] = seconds

    def offset(self, name: str) -> float:
        """Host ``name``'s current offset in seconds."""
        return self._offsets[name]

    def close(self) -> None:
        """Remove the offset files (a process still running reads the real
        time) and the run's libfaketime state. Idempotent."""
        for path in self._files.values():
            path.unlink(missing_ok=True)
            path.with_suffix(".new").unlink(missing_ok=True)
        remove_shared(self._run)


def remove_shared(run: str) -> bool:
    """Remove run ``run``'s libfaketime state, if there is any; whether there was."""
    semaphore, memory = shared_names(run)
    removed = False
    for unlink, name in (
        (posix_ipc.unlink_semaphore, semaphore),
        (posix_ipc.unlink_shared_memory, memory),
    ):
        try:
            unlink(name)
            removed = True
        except posix_ipc.ExistentialError:
            pass
    return removed
