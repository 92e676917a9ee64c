"""Wall-clock skew of a host's processes, through libfaketime.

A network namespace does not hold a clock (a time namespace shifts only the
monotonic and boot clocks), so a host's wall clock is skewed in its
processes: each is started with libfaketime ``LD_PRELOAD``-ed and pointed at
the host's offset file, which it reads again at every clock call
(``FAKETIME_NO_CACHE``), so rewriting the file moves the clock of every
running process of the host at once. The monotonic clock is left alone
(``FAKETIME_DONT_FAKE_MONOTONIC``): an offset moved back would run it
backwards.

Limits: only dynamically linked programs that read the clock through libc
see the skew (not Go binaries, not statically linked ones); reading the file
costs every ``time.time()`` 2.8 us instead of 0.11 (100,000 calls in a
``python -c`` loop, with and without the preload).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from . import tools


class Clocks:
    """The offset files of hosts ``names`` in ``directory``, each at 0 s
    until :meth:`set`. ``MissingCapability`` if libfaketime is missing
    (:func:`.tools.libfaketime`)."""

    def __init__(self, directory: Path, names: Iterable[str]) -> None:
        self.library = tools.libfaketime()
        self._files = {name: directory / f"clock-{name}" for name in names}
        self._offsets: dict[str, float] = {}
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
        """Remove the offset files (a process still running reads the real time)."""
        for path in self._files.values():
            path.unlink(missing_ok=True)
            path.with_suffix(".new").unlink(missing_ok=True)
