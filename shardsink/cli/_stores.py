"""How the ``read``, ``export`` and ``shard`` commands name and reach a
shard's stores.

Every command names them with ``--data-dir D`` (meaning ``file://D/blob``
and ``sqlite:///D/consensus.db``) or with ``--blob`` and ``--consensus``
URIs, which override it. No command creates a shard: one that is not there
is an error naming the shards the store holds.

Every command may change state (a read registers a reader), and a consensus
server serving the data dir answers from its cache as if it were the only
writer. So with ``--data-dir`` and no ``--consensus``, a command goes through
the server the data dir's lock names, and when none runs it holds that lock
while it uses the store (``shardsink.datadir``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from .. import datadir, faults
from .._address import REMOTE_SCHEMES
from .._curve import keys_for
from ..connect import open_shard
from ..datadir import DATA_DIR_ENV
from ..persist import PersistError, Shard, ShardNotFound, existing_shards
from ..storage import BLOB_ENV, STORE_ENV


def count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def store_args(
    parser: argparse.ArgumentParser, *, shard: bool = True, several: bool = False
) -> None:
    """``--data-dir``, ``--blob``, ``--consensus`` and (if ``shard``)
    ``--shard``, given again for each of ``several`` shards (a list, then)."""
    from_env = os.environ.get(DATA_DIR_ENV)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(from_env) if from_env else None,
        metavar="D",
        help="file://D/blob, sqlite:///D/consensus.db; through the consensus server serving D, "
        f"if one runs (default ${DATA_DIR_ENV})",
    )
    parser.add_argument(
        "--blob",
        metavar="URI",
        default=os.environ.get(BLOB_ENV),
        help=f"blob store URI (overrides --data-dir; default ${BLOB_ENV})",
    )
    parser.add_argument(
        "--consensus",
        metavar="URI",
        default=os.environ.get(STORE_ENV),
        help=f"consensus URI (overrides --data-dir; default ${STORE_ENV})",
    )
    if shard and several:
        parser.add_argument(
            "--shard",
            action="append",
            metavar="NAME",
            help="an existing shard (shardsink shard list names them); again for each of "
            "several, all as of one time (default: default)",
        )
    elif shard:
        parser.add_argument(
            "--shard",
            default="default",
            metavar="NAME",
            help="an existing shard (shardsink shard list names them; default: default)",
        )


def store_uris(args: argparse.Namespace) -> tuple[str, str]:
    """The blob and consensus URIs the arguments name; ``ValueError`` if they
    name none or the data directory does not hold a shard store."""
    blob, consensus = args.blob, args.consensus
    if args.data_dir is not None and (blob is None or consensus is None):
        data_dir = args.data_dir.resolve()
        if not (data_dir / "consensus.db").is_file():
            raise ValueError(f"--data-dir {args.data_dir}: no shard store (consensus.db) there")
        blob = blob or datadir.blob_uri(data_dir)
        consensus = consensus or datadir.consensus_uri(data_dir)
    if blob is None or consensus is None:
        raise ValueError("name the shard's stores with --data-dir D, or --blob and --consensus")
    return blob, consensus


@contextlib.contextmanager
def stores(args: argparse.Namespace) -> Iterator[tuple[str, str, bool]]:
    """The blob and consensus URIs the command uses: :func:`store_uris`, but
    with ``--data-dir`` and no ``--consensus``, the address of the consensus
    server serving the data dir, or else its store under its lock, held until
    the block ends (:func:`~shardsink.datadir.acquire_or_server`); and
    whether this process holds that lock (it owns the shard's blobs alone)."""
    blob, consensus = store_uris(args)
    if args.data_dir is None or args.consensus is not None:
        yield blob, consensus, False
        return
    taken = datadir.acquire_or_server(args.data_dir.resolve())
    if isinstance(taken, datadir.Holder):
        yield blob, taken.address, False
        return
    with taken:
        yield blob, consensus, True


def with_shard(func):
    """Run ``func(args, shard)`` on the shard the arguments name (see
    :func:`stores`), never creating it; shard errors become ``ValueError`` so
    the command line prints them as one line, a missing shard's naming the
    shards the store holds (for a data dir a consensus server serves: those
    of the store it serves). Under the data dir's lock the shard is its
    :attr:`~shardsink.persist.shard.Shard.sole_owner`: its reads take no
    lease and change no state."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        with _opened(args, [args.shard]) as shards:
            return func(args, shards[args.shard])

    return run


def with_shards(func):
    """:func:`with_shard` for every shard of a repeated ``--shard``
    (:func:`store_args` with ``several``; none given: ``default``): runs
    ``func(args, shards)``, the shards by name in the order given."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        names = list(dict.fromkeys(args.shard or ["default"]))
        with _opened(args, names) as shards:
            return func(args, shards)

    return run


@contextlib.contextmanager
def _opened(args: argparse.Namespace, names: list[str]) -> Iterator[dict[str, Shard]]:
    """The shards ``names`` of the stores the arguments name, open while the
    block runs (see :func:`with_shard`)."""
    with stores(args) as (blob, consensus, locked), contextlib.ExitStack() as stack:
        shards = {}
        try:
            for name in names:
                shards[name] = shard = stack.enter_context(
                    open_shard(
                        name,
                        blob=blob,
                        consensus=consensus,
                        create=False,
                        keys=keys_for(consensus, args.data_dir),
                    )
                )
                shard.sole_owner = locked
        except ShardNotFound as exc:
            store = store_uris(args)[1]
            served = store != consensus and args.data_dir is not None
            raise ValueError(f"{exc}{_listed(store, name) if served else ''}") from exc
        except PersistError as exc:
            raise ValueError(str(exc)) from exc
        try:
            yield shards
        except PersistError as exc:
            raise ValueError(str(exc)) from exc


def _listed(store: str, name: str) -> str:
    """:func:`~shardsink.persist.shard.existing_shards` of the store ``store``."""
    consensus = faults.open_consensus(store)
    try:
        return existing_shards(consensus, name)
    finally:
        consensus.close()


def shard_names(consensus: str) -> list[str]:
    """The shards the consensus store ``consensus`` holds, sorted; read
    without a lock (it changes nothing). ``ValueError`` if ``consensus`` is
    a consensus server's address: a server does not list its shards."""
    if urlsplit(consensus).scheme.lower() in REMOTE_SCHEMES:
        raise ValueError(
            f"--consensus {consensus} is a consensus server, which does not list its shards: "
            "name the store it serves (sqlite://..., postgresql://...) or its --data-dir"
        )
    store = faults.open_consensus(consensus)
    try:
        return sorted(store.list_shards())
    finally:
        store.close()
