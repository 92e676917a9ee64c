"""Opening a shard wherever its state lives: in a store this process opens
(a local shard machine, :mod:`shardsink.persist`) or behind a consensus
server (``tcp://``, ``ipc://``: a remote one, :mod:`shardsink.server`). The
choice sits here, above both, so neither imports the other."""

from __future__ import annotations

from typing import Any

from .persist.config import ShardConfig
from .persist.machine import ShardMachine
from .persist.shard import Shard
from .persist.shard import open_shard as open_local_or_remote
from .server.client import RemoteMachine


def open_shard(name: str = "default", **kwargs: Any) -> Shard:
    """:func:`shardsink.persist.shard.open_shard` (same arguments and errors)
    that also reaches a consensus server named by ``consensus``."""
    return open_local_or_remote(name, remote=_open_remote, **kwargs)


def _open_remote(
    address: str, name: str, schema: bytes, config: ShardConfig, create: bool
) -> ShardMachine:
    return RemoteMachine.open(
        address,
        name,
        schema=schema,
        config=config,
        create=create,
        timeout_s=config.server_timeout_s,
        retry_for_s=config.server_retry_for_s,
    )
