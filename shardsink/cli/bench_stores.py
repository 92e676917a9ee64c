"""``shardsink bench consensus`` and ``bench appends``: the store benchmarks'
flags and tables. What they measure, with racing client processes, is
:mod:`shardsink.bench.consensus`, :mod:`shardsink.bench.appends` and
(``appends --shards``) :mod:`shardsink.bench.appends_shards`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from ._commands import described
from ._output import table_console


def register(bench) -> None:
    """Add ``bench consensus`` and ``bench appends`` to ``bench``."""
    from ..bench import appends, consensus

    summary = "compare-and-set throughput of consensus stores under contention"
    parser = described(bench, "consensus", consensus, summary, _consensus, out=False)
    _race_arguments(parser)
    parser.add_argument("--shard", default="bench-consensus", help="shard the clients append to")
    parser.add_argument(
        "--bytes", type=int, default=128, help="payload bytes per version (default 128)"
    )
    summary = "compare-and-append throughput: in-process machine vs consensus server"
    parser = described(bench, "appends", appends, summary, _appends, out=False)
    _race_arguments(parser)
    parser.add_argument(
        "--blob-parts",
        action="store_true",
        help="each append one blob part instead of an inline one",
    )
    parser.add_argument(
        "--part-checks",
        choices=("on", "both"),
        default="on",
        help="both: also through a server that does not look parts up (default on)",
    )
    parser.add_argument(
        "--shards",
        type=counts,
        metavar="S[,S...]",
        help="many shards through one server against raw compare-and-set on the same store "
        "(--clients: clients per run, default one per shard; see appends_shards)",
    )
    parser.add_argument(
        "--processes",
        type=counts,
        metavar="P[,P...]",
        help="with --shards: the server runs' clients in P processes, a thread each "
        "(default: a process per client; raw compare-and-set always has one per client)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="with --shards: runs of each pair (default 1)"
    )
    parser.add_argument(
        "--txn",
        action="store_true",
        help="with --shards S: also one client appending an interval to all S shards as one "
        "transaction, against the same intervals as S appends one after another, side by side",
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="with --shards: results.json, report.md, plot"
    )
    # None tells --shards runs that --clients was not given (one client per shard)
    parser.set_defaults(func=_appends, clients=None)


def _race_arguments(parser: argparse.ArgumentParser) -> None:
    """``--store`` (repeatable), ``--clients``, ``--seconds`` and ``--json``."""
    parser.add_argument(
        "--store",
        action="append",
        required=True,
        metavar="URI",
        help="consensus store (sqlite:///abs/path.db or postgresql://...); repeat to compare",
    )
    parser.add_argument(
        "--clients", type=counts, default=[1, 4], help="client counts (default 1,4)"
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per run (default 5)"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")


def counts(text: str) -> list[int]:
    """``1,4`` as ``[1, 4]``; ``argparse.ArgumentTypeError`` unless every
    comma-separated part is a positive integer."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,4, got {text!r}")
    return counts


def _consensus(args: argparse.Namespace) -> int:
    from ..bench import consensus

    if args.bytes < 1:
        raise ValueError(f"--bytes must be positive, got {args.bytes}")
    console = table_console()
    runs = consensus.run(
        args.store, args.clients, args.seconds, args.shard, args.bytes, status=console.status
    )
    headers = [
        "store", "clients", "committed/s", "attempts/s", "mismatch rate", "CaS p50 ms",
        "CaS p99 ms", "errors",
    ]  # fmt: skip
    rows = [
        [
            r["store"], str(r["clients"]), f"{r['committed_per_s']:,.0f}",
            f"{r['attempts_per_s']:,.0f}", f"{r['mismatch_rate']:.1%}", f"{r['cas_ms_p50']:.2f}",
            f"{r['cas_ms_p99']:.2f}", str(r["errors"]),
        ]
        for r in runs
    ]  # fmt: skip
    title = f"compare-and-set on one shard, {args.seconds:g}s per run"
    console.print(_table(title, headers, rows))
    _figures(console, args.json, runs)
    return 0


def _appends(args: argparse.Namespace) -> int:
    from ..bench import appends

    if args.shards:
        if args.blob_parts or args.part_checks != "on":
            raise ValueError("--shards runs inline appends: drop --blob-parts and --part-checks")
        return _appends_shards(args)
    if args.out or args.repeats != 1 or args.processes is not None:
        raise ValueError("--out, --processes and --repeats go with --shards")
    console = table_console()
    runs = appends.run(
        args.store,
        args.clients or [1, 4],
        args.seconds,
        blob_parts=args.blob_parts,
        unchecked=args.part_checks == "both",
        status=console.status,
    )
    headers = [
        "store", "via", "clients", "appends/s", "server/local", "upper mismatches",
        "CaS mismatches", "p50 ms", "p99 ms",
    ]  # fmt: skip
    rows = [
        [
            r["store"], r["via"], str(r["clients"]), f"{r['appends_per_s']:,.0f}",
            f"{r['ratio_to_local']:.2f}", str(r["upper_mismatches"]), str(r["cas_mismatches"]),
            f"{r['append_ms_p50']:.2f}", f"{r['append_ms_p99']:.2f}",
        ]
        for r in runs
    ]  # fmt: skip
    parts = "one blob part" if args.blob_parts else "one inline part"
    title = f"compare-and-append on one shard, {parts} each, {args.seconds:g}s per run"
    console.print(_table(title, headers, rows, left=("store", "via")))
    _figures(console, args.json, runs)
    return 0


def _appends_shards(args: argparse.Namespace) -> int:
    """``bench appends --shards``: measure, print the table(s), write
    ``--json`` and ``--out``'s report."""
    from ..bench import appends_shards
    from ..storage import redact

    runs = appends_shards.runs_of(args.shards, args.clients, args.processes)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    console = table_console()
    started = time.monotonic()
    rows = appends_shards.run(
        args.store, runs, args.seconds, args.repeats, txn=args.txn, status=console.status
    )
    title = f"appends through one server vs raw CaS, {args.seconds:g}s per run"
    headers = [header for header, _, _ in appends_shards.COLUMNS]
    console.print(_table(title, headers, appends_shards.table_rows(rows)))
    if args.txn:
        title = "one interval of S shards: one transaction against S appends (one client)"
        headers = [header for header, _, _ in appends_shards.TXN_COLUMNS]
        console.print(_table(title, headers, appends_shards.txn_rows(rows)))
    command = "shardsink " + shlex.join(redact(a) for a in sys.argv[1:])
    if args.json:
        args.json.write_text(json.dumps({"command": command, "runs": rows}, indent=2) + "\n")
    if args.out:
        report = appends_shards.save(rows, args.out, command, time.monotonic() - started)
        console.print(f"report written to {report}")
    return 0


def _table(title: str, headers: list[str], rows: list[list[str]], left=("store",)):
    """A rich table of ``rows`` under ``headers``, the columns of ``left``
    left-justified, the figures right-justified."""
    from rich.table import Table

    table = Table(title=title)
    for header in headers:
        table.add_column(header, justify="left" if header in left else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _figures(console, path: Path | None, runs: list[dict]) -> None:
    """``--json``: the runs' figures into ``path``, if given, saying so."""
    if path:
        path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
        console.print(f"figures written to {path}")
