"""The consensus server as a child process: the one launcher for clusters,
tests, benchmarks and kill tests.

The child runs :data:`ROLE` (``shardsink consensus`` in ``ps``) in its own
process group, so a Ctrl-C meant for its parent does not stop it before the
last append. Its settings travel as its payload, a
:class:`~shardsink.server.config.ServeConfig` (msgpack), and its store and
blob URIs in its environment, never on a command line, which any user can
read (``ps``), nor in the payload: they may hold a password. Once it accepts
requests it sends :class:`Ready` on its channel (:mod:`.ready`), whatever it
logs. A restart binds the same address, so clients reconnect by themselves;
every state it serves is durable in the store.

By default it starts as a fresh interpreter, with the server's allocator
environment (:data:`shardsink._allocator.SERVER_ENV`), which only an
interpreter that has not loaded pyarrow yet takes. So a cluster starts it
that way too, not forked from its zygote: that costs its start the imports a
fork skips (``shardsink bench allocators``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec

from .._address import check_address
from .._allocator import missing_server_env
from .._wire import Message
from ..storage import BLOB_ENV, STORE_ENV, StorageError, redact
from .child import Child, Launch, Starter
from .ready import NotReady, wait_ready
from .spawn import SpawnStarter

#: The consensus child's main, :func:`shardsink.server.serve.main` (a floor
#: above this one: named, not imported).
ROLE = "shardsink.server.serve:main"

log = logging.getLogger(__name__)
T = TypeVar("T")


class Ready(Message, kw_only=True):
    """The consensus child accepts requests at ``address``; it serves
    Prometheus metrics at ``metrics_url`` (``None``: it does not)."""

    address: str
    metrics_url: str | None = None


decode_ready = msgspec.msgpack.Decoder(Ready).decode


class ServeSettings(Protocol):
    """What the launcher reads of the
    :class:`~shardsink.server.config.ServeConfig` it sends (a floor above
    this one, so known here by its shape)."""

    @property
    def bind(self) -> str | None: ...

    @property
    def store(self) -> str | None: ...

    @property
    def blob(self) -> str | None: ...


class ConsensusStartError(RuntimeError):
    """The server did not say it was ready in time; carries why and its log tail."""


class ConsensusProcess:
    """A consensus server child on ``store`` and ``blob`` with the settings
    of ``config``, a :class:`~shardsink.server.config.ServeConfig` whose
    ``bind`` is set (``ValueError`` naming it if the address policy refuses
    it) and whose ``store`` and ``blob`` are not (``ValueError``: the URIs
    go in the environment, the payload holds no secret). ``starter`` starts
    it (a fresh interpreter by default: only that takes
    :data:`~shardsink._allocator.SERVER_ENV`, which its environment carries
    where this process's or ``env`` does not set those variables); its log
    is ``run_dir/consensus.log`` (a private temporary directory by default,
    removed by :meth:`stop`).

    :meth:`start` and :meth:`restart` wait at most ``timeout_s`` for its
    :class:`Ready` and set :attr:`address` and :attr:`metrics_url`;
    :meth:`kill` SIGKILLs it (a crash); :meth:`stop` asks it to exit
    (SIGTERM, SIGKILL after a grace) and is idempotent. :attr:`store` is the
    store URI as it may be shown (redacted)."""

    def __init__(
        self,
        store: str,
        blob: str,
        config: ServeSettings,
        *,
        starter: Starter | None = None,
        run_dir: Path | None = None,
        timeout_s: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        if config.bind is None:
            raise ValueError("a consensus process needs the address to bind: config.bind")
        if config.store is not None or config.blob is not None:
            raise ValueError(
                "give a consensus process its stores as store and blob, not in its config: "
                "they go in its environment, its config in its payload"
            )
        self.store = redact(store)
        # checked here, so a bad address is named before a child fails to bind it
        self.bind = check_address(config.bind, for_bind=True, curve=True)  # the server's is CURVE
        self._own_dir = run_dir is None
        self.run_dir = (
            Path(tempfile.mkdtemp(prefix="shardsink-consensus-")) if run_dir is None else run_dir
        )
        self.timeout_s = timeout_s
        launch = Launch(
            kind="consensus",
            name="consensus",
            role=ROLE,
            payload=msgspec.msgpack.encode(config),
            env={**missing_server_env(), **(env or {}), STORE_ENV: store, BLOB_ENV: blob},
            stdout="pipe",
        )
        self.child = Child(launch, starter or SpawnStarter(), self.run_dir)
        self.address: str | None = None
        self.metrics_url: str | None = None
        self.restarts = 0

    @property
    def starts(self) -> int:
        return self.child.starts

    def start(self) -> ConsensusProcess:
        """Start the server and wait for its :class:`Ready`;
        :class:`ConsensusStartError` saying why and with its log tail if it
        exits first, says something else, or is silent for the timeout (it
        is then killed)."""
        self.child.start()
        try:
            ready = wait_ready(self.child, decode_ready, self.timeout_s)
        except NotReady as exc:
            self.child.kill()
            raise ConsensusStartError(
                f"the consensus server did not start on {self.store} ({exc}):\n"
                + self.child.log_tail()
            ) from None
        self.address, self.metrics_url = ready.address, ready.metrics_url
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

    def revive(self) -> bool:
        """:meth:`restart` it if it died (a crash, a kill); whether it had.
        :class:`ConsensusStartError` if the new one does not come up (it is
        then dead, and the next call tries again)."""
        if self.child.proc is None or self.alive():
            return False
        log.warning("the consensus process died; restarting it on %s", self.store)
        self.restart()
        return True

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

    def __enter__(self) -> ConsensusProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def through_restarts(
    call: Callable[[], T],
    *,
    revive: Callable[[], object],
    wait: Callable[[], None],
    for_s: float,
    what: str,
) -> T:
    """``call()``, tried again while it raises a storage error, for ``for_s``
    seconds (a run's ``append_retry_s``): before each try ``revive()``
    restarts a consensus process that died (:meth:`ConsensusProcess.revive`),
    as often as it dies, and ``wait()`` passes between tries. Past ``for_s``,
    the last error: a ``StorageError``, or :class:`ConsensusStartError` if
    the last restart failed. ``what`` names the call in the log."""
    deadline = time.monotonic() + for_s
    while True:
        try:
            revive()
            return call()
        except (StorageError, ConsensusStartError) as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("%s failed, trying again: %s", what, exc)
            wait()
