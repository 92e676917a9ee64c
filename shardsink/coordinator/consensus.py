"""The cluster's consensus process: started on a store, restarted on it.

``shardsink consensus serve --bind ipc://RUN/consensus`` runs as a child
(``shardsink consensus`` in ``ps``) in its own process group, so a Ctrl-C
meant for the coordinator does not stop it before the last append. It gets
its store and blob URIs in its environment, never on its command line, which
any user can read (``ps``) and which may hold a password. A restart binds the
same address, so clients reconnect by themselves; every state it serves is
durable in the store.
"""

from __future__ import annotations

import selectors
import signal
import subprocess
import time
from pathlib import Path

from .._address import check_address
from ..cluster.processes import Child, kill_all, spawn, stop
from ..storage.uri import BLOB_ENV, STORE_ENV, redact
from .errors import ClusterError


class ConsensusProcess:
    """The consensus server child of one cluster, bound to ``bind`` (default
    ``ipc://RUN_DIR/consensus``; ``ValueError`` naming it if the address
    policy refuses it). ``start`` and ``restart`` wait (bounded) for
    its "listening on" line; ``stop`` is idempotent. ``store`` is the store
    URI as it may be shown (redacted)."""

    def __init__(
        self, store: str, blob: str, run_dir: Path, *, timeout_s: float, bind: str | None = None
    ) -> None:
        self.store = redact(store)
        self._env = {STORE_ENV: store, BLOB_ENV: blob}
        self.run_dir = run_dir
        self.timeout_s = timeout_s
        # checked here, so a bad address is named before a child fails to bind it
        self.bind = check_address(bind or f"ipc://{run_dir / 'consensus'}", for_bind=True)
        self.address: str | None = None
        self.child: Child | None = None
        self.restarts = 0

    def start(self) -> str:
        """Start the server; return its address. :class:`ClusterError` with its
        log if it does not come up within the timeout."""
        self.child = spawn(
            "consensus",
            "consensus",
            ["consensus", "serve", "--bind", self.bind],
            run_dir=self.run_dir,
            stdout=subprocess.PIPE,
            env=self._env,
        )
        line = self._first_line()
        if not line.startswith("listening on "):
            tail = self.child.log_tail()
            self.stop()
            raise ClusterError(
                f"the consensus process did not start on {self.store} ({line.strip()!r}):\n{tail}"
            )
        self.address = line.removeprefix("listening on ").strip()
        return self.address

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def restart(self) -> str:
        """Reap a dead (or kill a live) server and start a new one on the store."""
        if self.child is not None:
            kill_all([self.child])
        self.restarts += 1
        return self.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; reaped either way."""
        child, self.child = self.child, None
        if child is not None:
            stop(child, signal.SIGTERM, grace_s)

    def _first_line(self) -> str:
        assert self.child is not None and self.child.proc.stdout is not None
        stdout = self.child.proc.stdout
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + self.timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(left):
                    return stdout.readline().decode(errors="replace")
        return "<timed out>"
