"""Opening a shard wherever its state lives: in a store this process opens
(a local shard machine, :mod:`shardsink.persist`) or behind a consensus
server (``tcp://``, ``ipc://``: a remote one, :mod:`shardsink.server`). The
choice sits here, above both, so neither imports the other."""

from __future__ import annotations

from typing import Any

from ._curve import ClientKeys, keys_for
from .persist.config import ShardConfig
from .persist.machine import ShardMachine
from .persist.shard import Shard
from .server.client import RemoteMachine


def open_shard(name: str = "default", *, keys: ClientKeys | None = None, **kwargs: Any) -> Shard:
    """:meth:`shardsink.persist.Shard.open` (same arguments and errors)
    that also reaches a consensus server named by ``consensus``; a
    ``tcp://`` one with the CURVE ``keys`` (default:
    :func:`~shardsink._curve.keys_for` the address, from ``SHARDSINK_KEYS``)."""

    def remote(
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
            keys=keys if keys is not None else keys_for(address),
        )

    return Shard.open(name, remote=remote, **kwargs)
