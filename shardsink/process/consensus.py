"""The consensus server as a child process: the one launcher for clusters,
tests, benchmarks and kill tests.

The child runs ``consensus serve`` (``shardsink consensus`` in ``ps``) in its
own process group, so a Ctrl-C meant for its parent does not stop it before
the last append. Its options travel in the launch's payload and its store and
blob URIs in its environment, never on a command line, which any user can
read (``ps``) and which may hold a password. A restart binds the same
address, so clients reconnect by themselves; every state it serves is durable
in the store.

Its role is ``consensus`` of an entry module: by default
``shardsink.server.serve`` started as a fresh interpreter (``python -m
shardsink.server.serve PARENT spawn consensus``), with the server's
allocator environment (:data:`shardsink._allocator.SERVER_ENV`), which only
an interpreter that has not loaded pyarrow yet takes. So a cluster starts it
that way too, not forked from its zygote (whose roles include it): that costs
its start the imports a fork skips (``shardsink bench allocators``).
"""

from __future__ import annotations

import selectors
import shutil
import tempfile
import time
from pathlib import Path

import msgspec

from .._address import check_address
from .._allocator import missing_server_env
from ..storage.uri import BLOB_ENV, STORE_ENV, redact
from .child import Child, Launch, Starter
from .spawn import SpawnStarter

#: The entry module whose ``consensus`` role serves (see the module doc).
ENTRY = "shardsink.server.serve"


class ConsensusStartError(RuntimeError):
    """The server did not say it was listening in time; carries its log tail."""


class ConsensusProcess:
    """A consensus server child on ``store`` and ``blob``, bound to ``bind``
    (``ValueError`` naming it if the address policy refuses it), with more
    ``flags`` of ``consensus serve``. ``starter`` starts it (a fresh
    interpreter by default: only that takes
    :data:`~shardsink._allocator.SERVER_ENV`, which its environment carries
    where this process's or ``env`` does not set those variables); its log
    is ``run_dir/consensus.log`` (a private temporary directory by default,
    removed by :meth:`stop`).

    :meth:`start` and :meth:`restart` wait at most ``timeout_s`` for its
    "listening on" line and set :attr:`address`; :meth:`kill` SIGKILLs it (a
    crash); :meth:`stop` asks it to exit (SIGTERM, SIGKILL after a grace) and
    is idempotent. :attr:`store` is the store URI as it may be shown
    (redacted)."""

    def __init__(
        self,
        store: str,
        blob: str,
        bind: str,
        *flags: str,
        starter: Starter | None = None,
        run_dir: Path | None = None,
        timeout_s: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.store = redact(store)
        # checked here, so a bad address is named before a child fails to bind it
        self.bind = check_address(bind, for_bind=True)
        self._own_dir = run_dir is None
        self.run_dir = (
            Path(tempfile.mkdtemp(prefix="shardsink-consensus-")) if run_dir is None else run_dir
        )
        self.timeout_s = timeout_s
        launch = Launch(
            kind="consensus",
            name="consensus",
            role="consensus",
            payload=msgspec.json.encode(["--bind", self.bind, *flags]),
            env={**missing_server_env(), **(env or {}), STORE_ENV: store, BLOB_ENV: blob},
            stdout="pipe",
        )
        self.child = Child(launch, starter or SpawnStarter(ENTRY), self.run_dir)
        self.address: str | None = None
        self.restarts = 0

    @property
    def starts(self) -> int:
        return self.child.starts

    def start(self) -> ConsensusProcess:
        """Start the server; :class:`ConsensusStartError` with its log if it
        does not come up within the timeout."""
        self.child.start()
        line = self._first_line()
        if not line.startswith("listening on "):
            self.child.kill()
            raise ConsensusStartError(
                f"the consensus server did not start on {self.store} ({line.strip()!r}):\n"
                + self.child.log_tail()
            )
        self.address = line.removeprefix("listening on ").strip()
        return self

    def alive(self) -> bool:
        return self.child.alive()

    def pids(self) -> list[int]:
        return [self.child.pid] if self.child.proc is not None else []

    def restart(self) -> str:
        """Reap a dead (or kill a live) server and start a new one on the store."""
        self.child.kill()
        self.restarts += 1
        self.start()
        assert self.address is not None
        return self.address

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and reap it."""
        self.child.kill()

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; reaped either way. Its exit
        status (``None`` if it never ran). Idempotent."""
        if self.child.proc is not None:
            self.child.stop(grace_s)
        if self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return self.child.returncode

    def _first_line(self) -> str:
        assert self.child.proc is not None and self.child.proc.stdout is not None
        stdout = self.child.proc.stdout
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + self.timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(left):
                    return stdout.readline().decode(errors="replace")
        return "<timed out>"

    def __enter__(self) -> ConsensusProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
