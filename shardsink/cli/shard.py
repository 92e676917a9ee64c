"""``shardsink read``, ``shardsink export`` and ``shardsink shard
inspect|manifest|history|verify|compact|gc``.

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
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import msgspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .. import datadir
from .._curve import keys_for
from ..connect import open_shard
from ..datadir import DATA_DIR_ENV
from ..persist.errors import PersistError
from ..persist.shard import Shard
from ..storage.uri import BLOB_ENV, STORE_ENV
from . import _output

FORMATS = ("table", "csv", "json", "jsonl", "parquet")
#: Formats that are not text, refused on a terminal.
BINARY_FORMATS = ("parquet",)
#: Rows ``read --format table`` shows unless ``--limit`` says otherwise.
TABLE_ROWS = 20
#: Rows per file of ``export``.
EXPORT_FILE_ROWS = 1_000_000
#: ``export``'s manifest: a Parquet file of no rows in the snapshot's schema,
#: the manifest as JSON in its footer under :data:`MANIFEST_KEY`. Not a JSON
#: file: Polars refuses a directory of files with different extensions (a
#: ``_`` prefix does not hide it from Polars, only from pyarrow), and reads an
#: empty Parquet file, like the empty ``_SUCCESS``, as nothing.
MANIFEST_NAME = "_manifest.parquet"
MANIFEST_KEY = b"shardsink.manifest"


def _column_list(text: str) -> list[str]:
    return [c.strip() for c in text.split(",")]


def _file_path(text: str) -> Path:
    """``read --output``'s file: a name ending in ``/`` means a directory."""
    if text.endswith("/"):
        raise argparse.ArgumentTypeError(
            f"{text} names a directory (it ends in /); give a file path, e.g. {text}snapshot.csv"
        )
    return Path(text)


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    read = commands.add_parser(
        "read",
        help="print or write a shard's consolidated snapshot",
        description="The consolidated snapshot: columns key, val, ts (the as-of time), "
        "diff; no zero diffs; sorted by key.",
    )
    _store_args(read)
    read.add_argument("--as-of", type=int, metavar="T", help="read as of T (default upper - 1)")
    read.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="json: one array; jsonl: JSON Lines, one object per row; parquet: binary, so "
        "only to --output or a pipe (default: table)",
    )
    read.add_argument(
        "--columns",
        type=_column_list,
        metavar="C,...",
        help="these columns, in this order (default key,val,ts,diff)",
    )
    read.add_argument(
        "--limit",
        type=_count,
        metavar="N",
        help=f"the first N rows (default for --format table: {TABLE_ROWS}, and it counts the rest)",
    )
    read.add_argument(
        "--output", type=_file_path, metavar="FILE", help="write here (default: stdout)"
    )
    read.set_defaults(func=_read)

    export = commands.add_parser(
        "export",
        help="write a shard's consolidated snapshot as a Parquet dataset any engine reads",
        description="DIR gets part-NNNNN.parquet files (the snapshot, sorted by key), "
        f"{MANIFEST_NAME} (no rows; the manifest, shard, as-of, rows, schema and files, as "
        f"JSON in its footer's metadata under {MANIFEST_KEY.decode()}) and an empty _SUCCESS, "
        "so pyarrow.dataset, Polars and DuckDB read DIR as it is. DIR must not exist or be "
        "empty; it appears whole or not at all.",
    )
    _store_args(export)
    export.add_argument("--as-of", type=int, metavar="T", help="as of T (default upper - 1)")
    export.add_argument("--output", type=Path, metavar="DIR", required=True)
    export.add_argument(
        "--file-rows",
        type=_count,
        default=EXPORT_FILE_ROWS,
        metavar="N",
        help=f"rows per Parquet file (default {EXPORT_FILE_ROWS})",
    )
    export.set_defaults(func=_export)
    _register_shard(commands)


def _register_shard(commands: argparse._SubParsersAction) -> None:
    """``shard inspect|manifest|history|verify|compact|gc``."""
    shard = commands.add_parser("shard", help="inspect and maintain a shard")
    sub = shard.add_subparsers(dest="shard_command", metavar="SUBCOMMAND", required=True)
    inspect = sub.add_parser(
        "inspect",
        help="upper, since, seqno, batches, parts, bytes, readers, writers",
    )
    _store_args(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(func=_inspect)
    manifest = sub.add_parser(
        "manifest",
        help="the live parts and inline updates of an as-of, the consolidation rule, and a "
        "DuckDB statement that reads the snapshot through them",
    )
    _store_args(manifest)
    manifest.add_argument("--as-of", type=int, metavar="T", help="as of T (default upper - 1)")
    manifest.add_argument("--json", action="store_true", help="print JSON")
    manifest.set_defaults(func=_manifest)
    history = sub.add_parser(
        "history",
        help="the versions that changed the data: upper, batches added and replaced, writer, time",
        description="Versions truncated by gc are gone.",
    )
    _store_args(history)
    history.add_argument(
        "--limit", type=_count, default=20, metavar="N", help="the last N (default 20)"
    )
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(func=_history)
    verify = sub.add_parser(
        "verify",
        help="check every live part and rollup against the state that describes it",
        description="Reads every part of the latest state (blob parts a row group at a time) "
        "and every rollup it keeps: each must exist, with its recorded length, row count and "
        "key and time bounds, and decode. Exit 0 with a one-line summary, 1 with a line per "
        "problem. Changes nothing but the reader lease it holds while it reads.",
    )
    _store_args(verify)
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_verify)
    compact = sub.add_parser("compact", help="merge runs of adjacent small batches")
    _store_args(compact)
    compact.set_defaults(func=_compact)
    gc = sub.add_parser("gc", help="expire readers, delete unreachable blobs, truncate consensus")
    _store_args(gc)
    gc.add_argument(
        "--sweep-grace-ms",
        type=int,
        metavar="MS",
        help="also delete unreferenced blobs older than MS milliseconds (default: none)",
    )
    gc.set_defaults(func=_gc)


def _store_args(parser: argparse.ArgumentParser) -> None:
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
                with open_shard(
                    args.shard,
                    blob=blob,
                    consensus=consensus,
                    create=False,
                    keys=keys_for(consensus, args.data_dir),
                ) as shard:
                    return func(args, shard)
            except PersistError as exc:
                raise ValueError(str(exc)) from exc

    return run


@_with_shard
def _read(args: argparse.Namespace, shard: Shard) -> int:
    if args.output is None and args.format in BINARY_FORMATS and sys.stdout.isatty():
        raise ValueError(
            f"--format {args.format} is binary and stdout is a terminal: write it with "
            "--output FILE, or pipe it (| duckdb, > file)"
        )
    stream = shard.batches(args.as_of, args.columns)
    if args.output is None:
        _write(stream, args.format, args.limit, sys.stdout.buffer)
        sys.stdout.flush()
    else:
        with _output.file_output(args.output) as out:
            _write(stream, args.format, args.limit, out)
    return 0


def _write(
    stream: pa.RecordBatchReader, fmt: str, limit: int | None, out: io.BufferedIOBase
) -> None:
    """Write ``stream`` (at most ``limit`` rows) to ``out`` in ``fmt``, one
    record batch at a time; the table format shows ``limit`` (default
    :data:`TABLE_ROWS`) rows and then how many the stream has."""
    if fmt == "table":
        shown, total, first = limit or TABLE_ROWS, 0, []
        for batch in stream:
            if total < shown:
                first.append(batch.slice(0, shown - total))
            total += batch.num_rows
        head = pa.Table.from_batches(first, stream.schema)
        out.write(format_table(head).encode())
        if total > head.num_rows:
            out.write(f"({head.num_rows} of {total} rows; --limit N shows more)\n".encode())
        else:
            out.write(f"({total} rows)\n".encode())
        return
    batches = _head(stream, limit) if limit is not None else stream
    if fmt == "parquet":
        with pq.ParquetWriter(out, batches.schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
    elif fmt == "csv":
        with pacsv.CSVWriter(out, batches.schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
    elif fmt == "jsonl":
        for batch in batches:
            out.writelines(msgspec.json.encode(row) + b"\n" for row in batch.to_pylist())
    else:
        out.write(b"[")
        first = True
        for batch in batches:
            if batch.num_rows:
                out.write((b"" if first else b",") + msgspec.json.encode(batch.to_pylist())[1:-1])
                first = False
        out.write(b"]\n")


def _head(stream: pa.RecordBatchReader, rows: int) -> pa.RecordBatchReader:
    """The first ``rows`` rows of ``stream``, read from it lazily."""

    def head() -> Iterator[pa.RecordBatch]:
        left = rows
        for batch in stream:
            yield batch.slice(0, left)
            left -= batch.num_rows
            if left <= 0:
                return

    return pa.RecordBatchReader.from_batches(stream.schema, head())


@_with_shard
def _export(args: argparse.Namespace, shard: Shard) -> int:
    """Write the dataset to a temporary directory beside ``--output`` (its
    symlinks followed), then rename it into place (see the command's
    description and :mod:`._output`)."""
    target = _output.export_target(args.output)
    as_of = args.as_of
    if as_of is None and shard.upper > 0:
        as_of = shard.upper - 1
    stream = shard.batches(as_of)
    with _output.directory_output(args.output, target) as temp:
        files, rows = _export_files(stream, temp, args.file_rows)
        manifest = {
            "shard": shard.name,
            "as_of": as_of,
            "rows": rows,
            "schema": [{"name": f.name, "type": str(f.type)} for f in stream.schema],
            "files": files,
            "sorted_by": ["key", "val"],
        }
        empty = stream.schema.empty_table()
        meta = {**(empty.schema.metadata or {}), MANIFEST_KEY: json.dumps(manifest).encode()}
        pq.write_table(empty.replace_schema_metadata(meta), temp / MANIFEST_NAME)
        (temp / "_SUCCESS").touch()
    print(json.dumps({"output": str(args.output), "rows": rows, "files": len(files)}))
    return 0


def _export_files(
    stream: pa.RecordBatchReader, directory: Path, file_rows: int
) -> tuple[list[str], int]:
    """Write ``stream`` as ``part-NNNNN.parquet`` files of at most
    ``file_rows`` rows in ``directory`` (one, empty, for an empty stream);
    return their names and the row count."""
    files: list[str] = []
    rows = writer_rows = 0
    writer = None
    try:
        for batch in stream:
            while batch.num_rows:
                if writer is None or writer_rows == file_rows:
                    if writer is not None:
                        writer.close()
                    files.append(f"part-{len(files):05d}.parquet")
                    writer = pq.ParquetWriter(directory / files[-1], stream.schema)
                    writer_rows = 0
                take = batch.slice(0, file_rows - writer_rows)
                writer.write_batch(take)
                writer_rows += take.num_rows
                rows += take.num_rows
                batch = batch.slice(take.num_rows)
        if writer is None:
            files.append("part-00000.parquet")
            pq.write_table(stream.schema.empty_table(), directory / files[0])
    finally:
        if writer is not None:
            writer.close()
    return files, rows


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
def _manifest(args: argparse.Namespace, shard: Shard) -> int:
    with shard.reader() as reader:
        manifest = reader.manifest(args.as_of)
    for part in manifest["parts"]:
        part["uri"] = part_uri(shard.blob.uri, part["key"])
    s3 = s3_settings(shard.blob.uri)
    if s3 is not None:
        manifest["s3"] = s3
    manifest["sql"] = duckdb_sql(manifest)
    if args.json:
        print(msgspec.json.encode(manifest).decode())
        return 0
    print(f"shard {manifest['shard']} as of {manifest['as_of']} (seqno {manifest['seqno']})")
    print(f"rule: {manifest['rule']}")
    if "s3" in manifest:
        print("s3: " + ", ".join(f"{k}={v}" for k, v in manifest["s3"].items()))
    for part in manifest["parts"]:
        print(f"  {part['uri']}  rows={part['rows']}  keys=[{part['key_lo']}, {part['key_hi']}]")
    print(f"inline updates: {len(manifest['inline'])}")
    return 0


def part_uri(blob: str, key: str) -> str:
    """Where the part ``key`` of the blob store ``blob`` is, as a path for a
    ``file://`` store, else a URI without the store's query (its endpoint and
    any secret)."""
    parts = urlsplit(blob)
    path = parts.path.rstrip("/") + "/" + key
    return (
        path if parts.scheme == "file" else urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    )


def s3_settings(blob: str) -> dict | None:
    """What an engine needs besides credentials to read the parts of the blob
    store ``blob`` (its ``uri``, which names endpoint and region) if it is an
    ``s3://`` one, named as DuckDB's S3 secret parameters: the endpoint's
    ``host:port``, whether it takes TLS, path-style URLs, the region. ``None``
    for any other store."""
    parts = urlsplit(blob)
    if parts.scheme != "s3":
        return None
    query = dict(parse_qsl(parts.query))
    endpoint = urlsplit(query["endpoint"])
    return {
        "endpoint": endpoint.netloc,
        "use_ssl": endpoint.scheme == "https",
        "url_style": "path",
        "region": query["region"],
    }


def duckdb_sql(manifest: dict) -> str | None:
    """One DuckDB statement computing the manifest's snapshot (its rule) from
    its parts and inline rows; ``None`` if an inline value has no SQL literal
    here (only ints, floats, strings, booleans and nulls do)."""
    as_of = manifest["as_of"]
    sources = []
    if manifest["parts"]:
        files = ", ".join(_literal(p["uri"]) for p in manifest["parts"])
        sources.append(f"select key, val, ts, diff from read_parquet([{files}])")
    if manifest["inline"]:
        try:
            rows = ", ".join(
                "(" + ", ".join(_literal(r[c]) for c in ("key", "val", "ts", "diff")) + ")"
                for r in manifest["inline"]
            )
        except TypeError:
            return None
        sources.append(f"select * from (values {rows}) as inline_rows(key, val, ts, diff)")
    if not sources:
        return (
            "select * from (values (null, null, null, null)) as t(key, val, ts, diff) where false"
        )
    return (
        f"select key, val, cast({as_of} as ubigint) as ts, cast(sum(diff) as bigint) as diff "
        f"from ({' union all '.join(sources)}) where ts <= {as_of} "
        "group by key, val having sum(diff) <> 0 order by key, val"
    )


def _literal(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


@_with_shard
def _history(args: argparse.Namespace, shard: Shard) -> int:
    entries = shard.history(args.limit)
    if args.json:
        print(msgspec.json.encode(entries).decode())
        return 0
    for e in entries:
        added = sum(a["rows"] for a in e["added"])
        size = sum(a["bytes"] for a in e["added"])
        when = (
            "-"
            if e["wall_ms"] is None
            else time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(e["wall_ms"] / 1000))
        )
        print(
            f"seqno {e['seqno']}  upper {e['upper']}  since {e['since']}  "
            f"+{len(e['added'])} batches ({added} rows, {size} B)  -{len(e['replaced'])} batches  "
            f"writer {e['writer'] or '-'}  at {when}"
        )
    return 0


@_with_shard
def _verify(args: argparse.Namespace, shard: Shard) -> int:
    report = shard.verify()
    if args.json:
        print(msgspec.json.encode({**msgspec.structs.asdict(report), "ok": report.ok}).decode())
    else:
        for problem in report.problems:
            print(problem)
        print(report.summary())
    return 0 if report.ok else 1


@_with_shard
def _compact(args: argparse.Namespace, shard: Shard) -> int:
    report = shard.compact()
    print(json.dumps(msgspec.structs.asdict(report)))
    return 0


@_with_shard
def _gc(args: argparse.Namespace, shard: Shard) -> int:
    # the sweep first: a grace it refuses then changes nothing at all
    swept = None if args.sweep_grace_ms is None else shard.sweep_leaked_blobs(args.sweep_grace_ms)
    report = msgspec.structs.asdict(shard.collect_garbage())
    if swept is not None:
        report["leaked_blobs_deleted"] = swept
    print(json.dumps(report))
    return 0
