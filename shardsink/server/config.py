"""What ``shardsink consensus serve`` runs with, as one msgspec Struct
(also what ``--config FILE.toml`` decodes into)."""

from __future__ import annotations

import msgspec

from .._bounds import at_least, port
from ..persist.config import COMPACT_INTERVAL_S, COMPACT_SLACK, SERVED_FIELDS, ShardConfig

_SHARD = ShardConfig()


class ServeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A consensus server's settings; ``ValueError`` naming the field for a
    value out of range.

    - ``bind``: where it listens (``ipc:///path``, its directory made 0700,
      or loopback ``tcp://127.0.0.1:PORT``, PORT 0: any); required to serve,
      but a file may leave it to the flag.
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
    """

    bind: str | None = None
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

    def __post_init__(self) -> None:
        at_least(
            self,
            0,
            "gc_interval_s",
            "sweep_interval_s",
            "compact_interval_s",
            "compact_slack",
            "retain",
        )
        port(self, "metrics_port")
        self.shard_config()  # its own checks

    def shard_config(self) -> ShardConfig:
        """The settings every shard runs with on this server."""
        return ShardConfig(
            writer_lease_ms=self.writer_lease_ms,
            retain=self.retain,
            **{name: getattr(self, name) for name in SERVED_FIELDS},
        )
