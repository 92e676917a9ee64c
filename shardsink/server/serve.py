"""A consensus server run in this process until SIGTERM or SIGINT: for
``shardsink consensus serve`` (:func:`serve`) and as a child process
(:func:`main`, the role :data:`shardsink.process.consensus.ROLE`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping

import msgspec

from .. import datadir
from .._curve import KEYS_ENV
from ..process import ParentChannel, Ready
from ..storage import BLOB_ENV, STORE_ENV
from .config import ServeConfig

log = logging.getLogger(__name__)

#: The fields a consensus child takes from its environment where its payload
#: leaves them unset. Not the data dir: a cluster's consensus child serves
#: its parent's, whose lock the coordinator holds (an inherited
#: ``$SHARDSINK_DATA_DIR`` is not the child's to take).
ROLE_ENV = {STORE_ENV: "store", BLOB_ENV: "blob", KEYS_ENV: "keys"}

_decode_config = msgspec.msgpack.Decoder(ServeConfig).decode


def main(payload: bytes) -> int:
    """A consensus server as a child (see :mod:`shardsink.process.consensus`):
    ``payload`` is its :class:`~.config.ServeConfig` (msgpack, no store
    URIs); the fields it leaves unset come from the environment
    (:data:`ROLE_ENV`). Once it accepts requests it tells its parent
    :class:`~shardsink.process.consensus.Ready` on its channel. Bad settings
    or stores: a line naming them on stderr (its log), exit status 2."""
    from .. import faults
    from ..storage import StorageError

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its parent stops it, not a Ctrl-C
    channel = ParentChannel()
    faults.arm_from_env(role="consensus")
    try:
        config = _with_environment(_decode_config(payload), os.environ)
        return serve(config, lambda address, url: _tell_ready(channel, address, url))
    except (ValueError, msgspec.DecodeError, StorageError) as exc:
        print(f"shardsink consensus serve: error: {exc}", file=sys.stderr, flush=True)
        return 2


def serve(config: ServeConfig, ready: Callable[[str, str | None], None]) -> int:
    """Serve ``config``'s stores at its bind until SIGTERM or SIGINT, holding
    its data dir's lock if it names one; ``ready(address, metrics_url)``
    once it accepts requests (``metrics_url``: ``None`` without metrics).
    Exit status 0."""
    from setproctitle import setproctitle

    from ..faults import open_blob, open_consensus
    from .metrics import ServerMetrics
    from .server import ConsensusServer

    setproctitle("shardsink consensus")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with contextlib.ExitStack() as held:
        store_uri, blob_uri, lock = config.store, config.blob, None
        if config.data_dir is not None:
            data_dir = datadir.create(config.data_dir)
            lock = held.enter_context(datadir.acquire(data_dir, datadir.CONSENSUS_SERVER))
            store_uri = store_uri or datadir.consensus_uri(data_dir)
            blob_uri = blob_uri or datadir.blob_uri(data_dir)
        store = open_consensus(store_uri)
        try:
            blob = open_blob(blob_uri)
        except BaseException:
            store.close()
            raise
        server = ConsensusServer(
            store,
            blob,
            config.bind,
            keys=config.server_keys(),
            check_parts=config.check_parts,
            batch_max=config.batch_max,
            batch_window_max_s=config.batch_window_max_ms / 1000,
            gc_interval_s=config.gc_interval_s,
            compact_interval_s=config.compact_interval_s,
            compact_slack=config.compact_slack,
            sweep_interval_s=config.sweep_interval_s,
            config=config.shard_config(),
        )
        held.callback(server.close)
        metrics_url = None
        if config.metrics_port is not None:
            metrics = ServerMetrics(server, config.metrics_port)
            held.callback(metrics.close)
            metrics_url = metrics.url
        if lock is not None:
            lock.update(address=server.address)
        ready(server.address, metrics_url)
        server.serve(stop)
    return 0


def _with_environment(config: ServeConfig, environ: Mapping[str, str]) -> ServeConfig:
    """``config`` with the fields of :data:`ROLE_ENV` it leaves unset taken
    from ``environ``; ``ValueError`` if it then has no bind or no stores."""
    given = {
        field: environ[name]
        for name, field in ROLE_ENV.items()
        if getattr(config, field) is None and name in environ
    }
    config = msgspec.structs.replace(config, **given)
    if config.bind is None:
        raise ValueError("no address to serve at: bind in the payload")
    if config.data_dir is None and (config.store is None or config.blob is None):
        raise ValueError(f"no stores: a data dir in the payload, or ${STORE_ENV} and ${BLOB_ENV}")
    return config


def _tell_ready(channel: ParentChannel, address: str, metrics_url: str | None) -> None:
    log.info("listening on %s%s", address, f", metrics at {metrics_url}" if metrics_url else "")
    channel.tell(Ready(address=address, metrics_url=metrics_url))
