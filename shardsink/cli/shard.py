"""``shardsink read`` and ``shardsink shard inspect|compact|gc``.

Every command names the shard's stores with ``--data-dir D`` (meaning
``file://D/blob`` and ``sqlite:///D/consensus.db``) or with ``--blob`` and
``--consensus`` URIs, which override it. No command creates a shard.

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
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .. import datadir
from ..connect import open_shard
from ..persist.errors import PersistError
from ..persist.shard import Shard
from ..storage.uri import BLOB_ENV, STORE_ENV

FORMATS = ("table", "csv", "json", "parquet")


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    read = commands.add_parser(
        "read",
        help="print or write a shard's consolidated snapshot",
        description="The consolidated snapshot: columns key, val, ts (the as-of time), "
        "diff; no zero diffs; sorted by key.",
    )
    _store_args(read)
    read.add_argument("--as-of", type=int, metavar="T", help="read as of T (default upper - 1)")
    read.add_argument("--format", choices=FORMATS, default="table", help="default: table")
    read.add_argument("--output", type=Path, metavar="FILE", help="write here, not to stdout")
    read.set_defaults(func=_read)

    shard = commands.add_parser("shard", help="inspect and maintain a shard")
    sub = shard.add_subparsers(dest="shard_command", metavar="SUBCOMMAND", required=True)
    inspect = sub.add_parser(
        "inspect",
        help="upper, since, seqno, batches, parts, bytes, readers, writers",
    )
    _store_args(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(func=_inspect)
    compact = sub.add_parser("compact", help="merge runs of adjacent small batches")
    _store_args(compact)
    compact.set_defaults(func=_compact)
    gc = sub.add_parser("gc", help="expire readers, delete unreachable blobs, truncate consensus")
    _store_args(gc)
    gc.add_argument(
        "--sweep-grace-ms",
        type=int,
        metavar="MS",
        help="also delete unreferenced blobs older than MS milliseconds",
    )
    gc.set_defaults(func=_gc)


def _store_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="D",
        help="file://D/blob, sqlite:///D/consensus.db; through the consensus server serving D, "
        "if one runs",
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
    parser.add_argument("--shard", default="default", metavar="NAME", help="default: default")


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
def _stores(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The blob and consensus URIs the command uses: :func:`store_uris`, but
    with ``--data-dir`` and no ``--consensus``, the address of the consensus
    server serving the data dir, or else its store under its lock, held until
    the block ends (:func:`~shardsink.datadir.acquire_or_server`)."""
    blob, consensus = store_uris(args)
    if args.data_dir is None or args.consensus is not None:
        yield blob, consensus
        return
    taken = datadir.acquire_or_server(args.data_dir.resolve())
    if isinstance(taken, datadir.Holder):
        yield blob, taken.address
        return
    with taken:
        yield blob, consensus


def _with_shard(func):
    """Run ``func(args, shard)`` on the shard the arguments name (see
    :func:`_stores`); shard errors become ``ValueError`` so the command line
    prints them as one line."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        with _stores(args) as (blob, consensus):
            try:
                with open_shard(args.shard, blob=blob, consensus=consensus, create=False) as shard:
                    return func(args, shard)
            except PersistError as exc:
                raise ValueError(str(exc)) from exc

    return run


@_with_shard
def _read(args: argparse.Namespace, shard: Shard) -> int:
    table = shard.snapshot(args.as_of)
    if args.output is None:
        _write(table, args.format, sys.stdout.buffer)
        sys.stdout.flush()
    else:
        with open(args.output, "wb") as out:
            _write(table, args.format, out)
    return 0


def _write(table: pa.Table, fmt: str, out: io.BufferedIOBase) -> None:
    if fmt == "parquet":
        pq.write_table(table, out)
    elif fmt == "csv":
        pacsv.write_csv(table, out)
    elif fmt == "json":
        out.write(msgspec.json.encode(table.to_pylist()) + b"\n")
    else:
        out.write(format_table(table).encode())


def format_table(table: pa.Table) -> str:
    """``table`` as aligned plain-text columns with a header line."""
    columns = [
        [name, *(str(v) for v in table.column(name).to_pylist())] for name in table.column_names
    ]
    widths = [max(len(cell) for cell in column) for column in columns]
    lines = []
    for row in zip(*columns, strict=True):
        lines.append("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    return "\n".join(lines) + "\n"


@_with_shard
def _inspect(args: argparse.Namespace, shard: Shard) -> int:
    info = shard.inspect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for name, value in info.items():
        if isinstance(value, dict):
            print(f"{name}: {len(value)}")
            for ident, fields in value.items():
                detail = ", ".join(f"{k}={v}" for k, v in fields.items())
                print(f"  {ident}: {detail}")
        else:
            print(f"{name}: {value}")
    return 0


@_with_shard
def _compact(args: argparse.Namespace, shard: Shard) -> int:
    report = shard.compact()
    print(json.dumps(msgspec.structs.asdict(report)))
    return 0


@_with_shard
def _gc(args: argparse.Namespace, shard: Shard) -> int:
    report = msgspec.structs.asdict(shard.collect_garbage())
    if args.sweep_grace_ms is not None:
        report["leaked_blobs_deleted"] = shard.sweep_leaked_blobs(args.sweep_grace_ms)
    print(json.dumps(report))
    return 0
