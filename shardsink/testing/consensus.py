"""A consensus server in a child process, for tests, benchmarks and kill tests."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time

from ..storage.uri import BLOB_ENV, STORE_ENV


class ServerProcess:
    """``shardsink consensus serve`` as a child process.

    ``start()`` waits (bounded) for its "listening on ADDR" line and sets
    ``address``; ``kill()`` SIGKILLs it (a crash); ``stop()`` asks it to exit
    (SIGTERM, then SIGKILL after ``grace_s``) and is idempotent. Only the
    process this object started is ever signalled.
    """

    def __init__(
        self,
        store: str,
        blob: str,
        bind: str,
        *extra: str,
        startup_timeout_s: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = [
            sys.executable, "-m", "shardsink.cli", "consensus", "serve", "--bind", bind, *extra,
        ]  # fmt: skip
        self.startup_timeout_s = startup_timeout_s
        # the URIs in the environment, not in argv, where a password would show in `ps`
        self.env = {
            **os.environ,
            **(env or {}),
            STORE_ENV: store,
            BLOB_ENV: blob,
            "PYTHONUNBUFFERED": "1",
        }
        self.address: str | None = None
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        # the server's log, kept so that a failed start can say why
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())

    def start(self) -> ServerProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"server pid {self.proc.pid} is still running")
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            env=self.env,
        )
        self.starts += 1
        line = self._read_line(self.startup_timeout_s)
        if not line.startswith("listening on "):
            self.kill()
            self._log.seek(0)
            log = self._log.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"consensus server did not start: {self.argv}: {line!r}\n{log}")
        self.address = line.removeprefix("listening on ").strip()
        return self

    def _read_line(self, timeout_s: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(left):
                    return self.proc.stdout.readline().decode(errors="replace")
            return "<timed out>"
        finally:
            sel.close()

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Ask the server to exit; returns its exit code. Idempotent."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
