"""What ``shardsink consensus serve`` runs with, as one msgspec Struct
(also what ``--config FILE.toml`` decodes into)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from .._bounds import at_least, port
from .._curve import ServerKeys, needs_keys, server_keys
from ..persist import COMPACT_INTERVAL_S, COMPACT_SLACK, SERVED_FIELDS, ShardConfig, check_grace

#: The most shards' commands one group commit stores (``batch_max``).
BATCH_MAX = 256
#: The longest the server gathers requests for a group commit
#: (``batch_window_max_ms``; :class:`~.group_commit.BatchWindow`).
BATCH_WINDOW_MAX_S = 0.002

_SHARD = ShardConfig()


class ServeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A consensus server's settings; ``ValueError`` naming the field for a
    value out of range.

    - ``bind``: where it listens (``ipc:///path``, its directory made 0700,
      or loopback ``tcp://127.0.0.1:PORT``, PORT 0: any); required to serve,
      but a file may leave it to the flag.
    - ``keys``: the CURVE key directory a ``tcp://`` bind authenticates
      clients with (:mod:`shardsink._curve`; default ``DATA_DIR/keys``).
    - ``data_dir``: serve its stores (``sqlite:///D/consensus.db``,
      ``file://D/blob``) and hold its lock; ``store`` and ``blob`` name other
      stores and override it. A server needs both stores named one way or
      the other.
    - ``gc_interval_s``, ``sweep_interval_s``, ``compact_interval_s``: how
      often maintenance runs GC, the leaked-blob sweep and looks for the
      spine's merges (0: never); ``compact_slack``: it merges once the
      merges remove this many batches.
    - ``writer_lease_ms``, ``retain`` and the served fields
      (:data:`~shardsink.persist.config.SERVED_FIELDS`: ``rollup_threshold``,
      ``leaked_blob_grace_ms``, ``max_attempts``): every shard's settings
      here (:meth:`shard_config`).
    - ``metrics_port``: serve Prometheus metrics on ``127.0.0.1:PORT`` (0: a
      free port); ``None``: none.
    - ``check_parts``: every append's and compaction's blob parts are looked
      up before they commit (off: only to measure the look's cost).
    - ``batch_max``: the most shards' commands one group commit stores (1:
      every command its own store transaction); ``batch_window_max_ms``: the
      longest the server waits to gather a batch (0: never waits, commits
      what is queued).
    """

    bind: str | None = None
    keys: str | None = None
    data_dir: str | None = None
    store: str | None = None
    blob: str | None = None
    gc_interval_s: float = 60.0
    sweep_interval_s: float = 600.0
    compact_interval_s: float = COMPACT_INTERVAL_S
    compact_slack: int = COMPACT_SLACK
    writer_lease_ms: int = _SHARD.writer_lease_ms
    retain: int = _SHARD.retain
    rollup_threshold: int = _SHARD.rollup_threshold
    leaked_blob_grace_ms: int = _SHARD.leaked_blob_grace_ms
    max_attempts: int = _SHARD.max_attempts
    metrics_port: int | None = None
    check_parts: bool = True
    batch_max: int = BATCH_MAX
    batch_window_max_ms: float = BATCH_WINDOW_MAX_S * 1000

    def __post_init__(self) -> None:
        at_least(
            self,
            0,
            "gc_interval_s",
            "sweep_interval_s",
            "compact_interval_s",
            "compact_slack",
            "retain",
            "batch_window_max_ms",
        )
        at_least(self, 1, "batch_max")
        port(self, "metrics_port")
        self.shard_config()  # its own checks
        check_grace(self.leaked_blob_grace_ms, self.writer_lease_ms)

    def server_keys(self) -> ServerKeys | None:
        """The CURVE keys of a ``tcp://`` bind (made where missing), ``None``
        for ``ipc://``; ``ValueError`` if a ``tcp://`` bind has no key
        directory."""
        if self.bind is None or not needs_keys(self.bind):
            return None
        directory = self.keys or (None if self.data_dir is None else f"{self.data_dir}/keys")
        if directory is None:
            raise ValueError(
                f"bind {self.bind} answers only CURVE clients: give its key directory "
                "(--keys DIR, made if missing) or serve a data dir (its keys/)"
            )
        return server_keys(Path(directory))

    def shard_config(self) -> ShardConfig:
        """The settings every shard runs with on this server."""
        return ShardConfig(
            writer_lease_ms=self.writer_lease_ms,
            retain=self.retain,
            **{name: getattr(self, name) for name in SERVED_FIELDS},
        )
