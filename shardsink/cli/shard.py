"""``shardsink read`` and ``shardsink export``: a shard's consolidated
snapshot, printed, written to a file, or written as a Parquet dataset (of
several shards: one each, all as of one time); the stores, and why no
command creates a shard: :mod:`._stores`."""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..persist import Shard
from . import _output
from ._stores import count, store_args, with_shard, with_shards

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


def register(commands: argparse._SubParsersAction) -> None:
    read = commands.add_parser(
        "read",
        help="print or write a shard's consolidated snapshot",
        description="The consolidated snapshot: columns key, val, ts (the as-of time), "
        "diff; no zero diffs; sorted by key.",
    )
    store_args(read)
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
        type=count,
        metavar="N",
        help=f"the first N rows (default for --format table: {TABLE_ROWS}, and it counts the rest)",
    )
    read.add_argument(
        "--output", type=_file_path, metavar="FILE", help="write here (default: stdout)"
    )
    read.set_defaults(func=_read)

    export = commands.add_parser(
        "export",
        help="write a shard's consolidated snapshot (or several shards', as of one time) as a "
        "Parquet dataset any engine reads",
        description="DIR gets part-NNNNN.parquet files (the snapshot, sorted by key), "
        f"{MANIFEST_NAME} (no rows; the manifest, shard, as-of, rows, schema and files, as "
        f"JSON in its footer's metadata under {MANIFEST_KEY.decode()}) and an empty _SUCCESS, "
        "so pyarrow.dataset, Polars and DuckDB read DIR as it is. With --shard given for "
        "each of several shards, DIR/NAME is such a dataset of each, all as of one time, "
        "and DIR gets an empty _SUCCESS. DIR must not exist or be empty; it appears whole "
        "or not at all.",
    )
    store_args(export, several=True)
    export.add_argument(
        "--as-of",
        type=int,
        metavar="T",
        help="as of T (default upper - 1: of several shards, the smallest upper - 1)",
    )
    export.add_argument("--output", type=Path, metavar="DIR", required=True)
    export.add_argument(
        "--file-rows",
        type=count,
        default=EXPORT_FILE_ROWS,
        metavar="N",
        help=f"rows per Parquet file (default {EXPORT_FILE_ROWS})",
    )
    export.set_defaults(func=_export)


@with_shard
def _read(args: argparse.Namespace, shard: Shard) -> int:
    if args.output is None:
        _no_binary_to_a_terminal(args.format, sys.stdout, "stdout")
        _write(shard.batches(args.as_of, args.columns), args.format, args.limit, sys.stdout.buffer)
        sys.stdout.flush()
    else:
        with _output.file_output(args.output) as out:
            _no_binary_to_a_terminal(args.format, out, f"--output {args.output}")
            _write(shard.batches(args.as_of, args.columns), args.format, args.limit, out)
    return 0


def _no_binary_to_a_terminal(fmt: str, out: io.IOBase, name: str) -> None:
    """``ValueError`` if ``fmt`` is binary and ``out`` (called ``name``) a terminal."""
    if fmt in BINARY_FORMATS and out.isatty():
        raise ValueError(
            f"--format {fmt} is binary and {name} is a terminal: write it with --output FILE, "
            "or pipe it (| duckdb, > file)"
        )


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


@with_shards
def _export(args: argparse.Namespace, shards: dict[str, Shard]) -> int:
    """Write the dataset (of several shards: one each, as of one time) to a
    temporary directory beside ``--output`` (its symlinks followed), then
    rename it into place (see the command's description and :mod:`._output`)."""
    target = _output.export_target(args.output)
    as_of = args.as_of
    if as_of is None:
        upper = min(shard.upper for shard in shards.values())
        as_of = upper - 1 if upper > 0 else None
    written = {}
    with _output.directory_output(args.output, target) as temp:
        for name, shard in shards.items():
            directory = temp if len(shards) == 1 else temp / name
            directory.mkdir(exist_ok=True)
            written[name] = _export_shard(shard, as_of, directory, args.file_rows)
        if len(shards) > 1:
            (temp / "_SUCCESS").touch()
    rows = sum(r for r, _ in written.values())
    files = sum(f for _, f in written.values())
    out: dict = {"output": str(args.output), "rows": rows, "files": files}
    if len(shards) > 1:
        out["as_of"] = as_of
        out["shards"] = {name: {"rows": r, "files": f} for name, (r, f) in written.items()}
    print(json.dumps(out))
    return 0


def _export_shard(
    shard: Shard, as_of: int | None, directory: Path, file_rows: int
) -> tuple[int, int]:
    """Write ``shard``'s snapshot as of ``as_of`` as a dataset in
    ``directory``: its files, manifest and ``_SUCCESS``; its rows and files."""
    stream = shard.batches(as_of)
    files, rows = _export_files(stream, directory, file_rows)
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
    pq.write_table(empty.replace_schema_metadata(meta), directory / MANIFEST_NAME)
    (directory / "_SUCCESS").touch()
    return rows, len(files)


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
