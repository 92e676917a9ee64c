"""Opening a shard wherever its state lives: in a store this process opens
(a local shard machine, :mod:`shardsink.persist`) or behind a consensus
server (``tcp://``, ``ipc://``: a remote one, :mod:`shardsink.server`). The
choice sits here, above both, so neither imports the other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from . import faults
from ._curve import ClientKeys, keys_for
from .persist import REMOTE_SCHEMES, LocalTransactions, Shard, ShardConfig, ShardMachine, ShardSet
from .server import RemoteMachine


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


def open_shards(
    schemas: Mapping[str, pa.Schema | None],
    *,
    blob: str,
    consensus: str,
    keys: ClientKeys | None = None,
    **kwargs: Any,
) -> ShardSet:
    """Shards ``schemas`` names (each with its ``key``/``val`` schema, or
    ``None`` for an existing shard's), of one blob and one consensus store,
    opened together for transactions across them and snapshots of all as
    of one time (:class:`~shardsink.persist.shards.ShardSet`). ``consensus``
    is a store URI (the set opens it once, for every shard) or a consensus
    server's address (it runs the transactions); ``kwargs`` go to
    :meth:`~shardsink.persist.Shard.open` (``config``, ``create``, ...).
    Errors as :func:`open_shard`'s; ``ValueError`` for no shard."""
    if not schemas:
        raise ValueError("open_shards needs at least one shard")
    remote = urlsplit(consensus).scheme.lower() in REMOTE_SCHEMES
    owned: list = []
    store = consensus if remote else faults.open_consensus(consensus)
    if not remote:
        owned.append(store)
    shards: dict[str, Shard] = {}
    try:
        for name, schema in schemas.items():
            shards[name] = open_shard(
                name, blob=blob, consensus=store, schema=schema, keys=keys, **kwargs
            )
        if remote:
            machine = next(iter(shards.values())).machine
            assert isinstance(machine, RemoteMachine)
            transactions = machine.transactions()
        else:
            machines = {name: shard.machine for name, shard in shards.items()}
            transactions = LocalTransactions(machines, store)
    except BaseException:
        for shard in shards.values():
            shard.close()
        for resource in owned:
            resource.close()
        raise
    return ShardSet(shards, transactions, owned)
