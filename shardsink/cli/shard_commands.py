"""``shardsink shard list|inspect|manifest|history|verify|compact|gc``: the
shards of a store, a shard's state, what an as-of reads, and maintenance by
hand (the stores: :mod:`._stores`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import msgspec

from .._units import GIB, KIB, MIB
from ..persist import Shard
from ..storage import StorageError, redact
from ._stores import count, shard_names, store_args, store_uris, with_shard


def register(commands: argparse._SubParsersAction) -> None:
    """``shard list|inspect|manifest|history|verify|compact|gc``."""
    shard = commands.add_parser("shard", help="list, inspect and maintain shards")
    sub = shard.add_subparsers(dest="shard_command", metavar="SUBCOMMAND", required=True)
    listing = sub.add_parser(
        "list",
        help="the shards a consensus store holds",
        description="Reads the store (never a consensus server, which does not list its "
        "shards: name the store it serves, or its data dir) and changes nothing.",
    )
    store_args(listing, shard=False)
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    listing.set_defaults(func=_list)
    _register_state(sub)
    _register_maintenance(sub)


def _register_state(sub: argparse._SubParsersAction) -> None:
    """``shard inspect|manifest|history|verify``."""
    inspect = sub.add_parser(
        "inspect",
        help="upper, since, seqno, batches, parts, bytes, readers, writers",
    )
    store_args(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(func=_inspect)
    manifest = sub.add_parser(
        "manifest",
        help="the live parts and inline updates of an as-of, the consolidation rule, and a "
        "DuckDB statement that reads the snapshot through them",
    )
    store_args(manifest)
    manifest.add_argument("--as-of", type=int, metavar="T", help="as of T (default upper - 1)")
    manifest.add_argument("--json", action="store_true", help="print JSON")
    manifest.set_defaults(func=_manifest)
    history = sub.add_parser(
        "history",
        help="the versions that changed the data: appends (interval, rows, writer, UTC time), "
        "compactions (batches merged), since advances",
        description="Oldest first, one line each. Versions truncated by gc are gone. --json "
        "gives each version's fields, with its kind: append, compaction, since or other.",
    )
    store_args(history)
    history.add_argument(
        "--limit", type=count, default=20, metavar="N", help="the last N (default 20)"
    )
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(func=_history)
    verify = sub.add_parser(
        "verify",
        help="check every live part and rollup against the state that describes it",
        description="Reads every part of the latest state (blob parts a row group at a time) "
        "and every rollup it keeps: each must exist, with its recorded length, row count and "
        "key and time bounds, and decode, and each batch's rows must match the digest it was "
        "written with. Exit 0 with a one-line summary when everything was checked and matches; "
        "1 with a line per problem, or when some batch has no digest to check (its count in "
        "the summary). Changes nothing but the reader lease it holds while it reads.",
    )
    store_args(verify)
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_verify)


def _register_maintenance(sub: argparse._SubParsersAction) -> None:
    """``shard compact|gc``."""
    compact = sub.add_parser("compact", help="merge runs of adjacent small batches")
    store_args(compact)
    compact.set_defaults(func=_compact)
    gc = sub.add_parser(
        "gc",
        help="expire readers, delete unreachable blobs, truncate consensus",
        description="Prints what it did: readers and writers expired, blobs deleted and their "
        "bytes, versions truncated, rollups retired; --json gives the report with every "
        "blob's key.",
    )
    store_args(gc)
    gc.add_argument("--json", action="store_true", help="print the report as JSON")
    gc.add_argument(
        "--sweep-grace-ms",
        type=int,
        metavar="MS",
        help="also delete unreferenced blobs older than MS milliseconds (default: none)",
    )
    gc.set_defaults(func=_gc)


@with_shard
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


@with_shard
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


@with_shard
def _history(args: argparse.Namespace, shard: Shard) -> int:
    entries = [{**e, "kind": history_kind(e)} for e in shard.history(args.limit)]
    if args.json:
        print(msgspec.json.encode(entries).decode())
        return 0
    for e in entries:
        print(f"seqno {e['seqno']}  {history_line(e)}")
    return 0


def history_kind(entry: dict) -> str:
    """What a version of ``shard history`` did: ``append`` (a writer's batch),
    ``compaction`` (batches merged into others, no writer), ``since`` (since
    advanced, nothing else), ``other``."""
    if entry["writer"] is not None:
        return "append"
    if entry["added"] and entry["replaced"]:
        return "compaction"
    if entry["since"] is not None and not (entry["added"] or entry["replaced"]):
        return "since"
    return "other"


def history_line(entry: dict) -> str:
    """A version of ``shard history`` in words."""
    kind = entry["kind"]
    added = entry["added"]
    rows = sum(a["rows"] for a in added)
    parts = sum(a["parts"] for a in added)
    size = human_bytes(sum(a["bytes"] for a in added))
    since = "" if entry["since"] is None else f", since {entry['since']}"
    if kind == "append":
        span = ", ".join(f"[{a['lower']}, {a['upper']})" for a in added) or "nothing"
        return (
            f"append {span}: {rows} rows, {plural(parts, 'part')}, {size}; "
            f"upper {entry['upper']}{since}; "
            f"writer {entry['writer']} at {utc(entry['wall_ms'])}"
        )
    if kind == "compaction":
        return (
            f"compaction: {len(entry['replaced'])} batches merged into {len(added)} "
            f"({rows} rows, {plural(parts, 'part')}, {size}){since}"
        )
    if kind == "since":
        return f"since advanced to {entry['since']}"
    return (
        f"{len(added)} batches added ({rows} rows), {len(entry['replaced'])} replaced"
        + ("" if entry["upper"] is None else f"; upper {entry['upper']}")
        + since
    )


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def utc(wall_ms: int | None) -> str:
    """Milliseconds since the epoch as ``2026-12-02T07:33:32.123Z`` (UTC)."""
    if wall_ms is None:
        return "an unknown time"
    seconds, ms = divmod(int(wall_ms), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def human_bytes(n: int) -> str:
    """``n`` bytes for a person: ``812 B``, ``3.2 KiB``, ``41.0 MiB``."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@with_shard
def _verify(args: argparse.Namespace, shard: Shard) -> int:
    report = shard.verify()
    if args.json:
        document = {**msgspec.structs.asdict(report), "ok": report.ok, "verified": report.verified}
        print(msgspec.json.encode(document).decode())
    else:
        for problem in report.problems:
            print(problem)
        print(report.summary())
    return 0 if report.verified else 1


@with_shard
def _compact(args: argparse.Namespace, shard: Shard) -> int:
    report = shard.compact()
    print(json.dumps(msgspec.structs.asdict(report)))
    return 0


@with_shard
def _gc(args: argparse.Namespace, shard: Shard) -> int:
    # sizes listed before: the report names the keys it deleted, not their
    # bytes; a store that fails the listing leaves them unknown, not the gc undone
    try:
        sizes = {m.key: m.size for m in shard.blob.list_meta(f"{shard.name}/")}
    except StorageError:
        sizes = None
    # the sweep first: a grace it refuses then changes nothing at all
    swept = None if args.sweep_grace_ms is None else shard.sweep_leaked_blobs(args.sweep_grace_ms)
    report = msgspec.structs.asdict(shard.collect_garbage())
    deleted = [*report["blobs_deleted"], *(swept or ())]
    report["bytes_deleted"] = None if sizes is None else sum(sizes.get(k, 0) for k in deleted)
    if swept is not None:
        report["leaked_blobs_deleted"] = swept
    if args.json:
        print(json.dumps(report))
        return 0
    print(gc_summary(shard.name, report))
    return 0


def gc_summary(shard: str, report: dict) -> str:
    """``shard gc``'s report (with ``bytes_deleted``, ``None`` if unknown) in
    words, counts only."""
    swept = report.get("leaked_blobs_deleted")
    lines = [
        f"gc of shard {shard!r}: deleted {plural(len(report['blobs_deleted']), 'retired blob')}"
        + ("" if swept is None else f" and {plural(len(swept), 'leaked one')}")
        + (
            ", their size unknown (the listing failed)"
            if report["bytes_deleted"] is None
            else f", {human_bytes(report['bytes_deleted'])} in all"
        ),
        f"  expired {plural(len(report['readers_expired']), 'reader')} and "
        f"{plural(len(report['writers_expired']), 'writer')}; readers hold seqno "
        f"{report['seqno_hold']}",
        "  "
        + (
            f"truncated {plural(report['versions_truncated'], 'version')} below seqno "
            f"{report['truncated_below']}"
            if report["versions_truncated"]
            else "truncated no versions"
        )
        + f"; retired {plural(report['rollups_retired'], 'rollup')}",
        "  (--json lists every key)",
    ]
    return "\n".join(lines)


def _list(args: argparse.Namespace) -> int:
    consensus = args.consensus or store_uris(args)[1]
    names = shard_names(consensus)
    if args.json:
        print(json.dumps(names))
    elif not names:
        print(f"no shards in {redact(consensus)}", file=sys.stderr)
    for name in () if args.json else names:
        print(name)
    return 0
