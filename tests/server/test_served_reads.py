"""Must-show 2 of issue 15, wherever the shard lives: the snapshot through
the API, ``shardsink read``, ``shardsink export`` read by DuckDB and the
``shard manifest`` SQL run by DuckDB all equal the churn workload's
collection (retractions included), before and after a compaction and its
GC; ``shard history`` shows the appends and the compaction. The stores:
the data dir itself; a consensus server named by the data dir's lock or
by ``--consensus``; S3 blobs, directly and through a server."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from fsspec.implementations.arrow import ArrowFSWrapper
from pyarrow import fs as pafs

from shardsink import ConsensusServer, datadir, open_shard
from shardsink.cli import main
from shardsink.persist.config import ShardConfig
from shardsink.server import server as server_module
from shardsink.storage import open_blob
from shardsink.workloads import Workload
from tests.helpers.server import serving

CHURN = Workload("churn", rows_per_interval=500, interval_ms=10)
INTERVALS = 6
#: Several small blob parts per interval, none inline.
SMALL_PARTS = ShardConfig(inline_max_bytes=0, blob_target_bytes=8192)


class _S3(ArrowFSWrapper):
    """pyarrow's S3 client as an fsspec filesystem for ``s3://`` paths, so
    DuckDB reads the manifest's URIs without its httpfs extension (which it
    downloads, and this machine reaches no download site)."""

    protocol = "s3"


@contextlib.contextmanager
def located(
    where: str, tmp_path: Path, request
) -> Iterator[tuple[list[str], dict, ConsensusServer | None]]:
    """The stores of ``where`` (``data-dir``, ``lock``, ``address``, ``s3``,
    ``s3+address``), alive for the block: as a shardsink command names them,
    as ``open_shard`` arguments reaching the same state, and the consensus
    server serving them, if one does."""
    data = tmp_path / "d"
    data.mkdir(mode=0o700)
    if where.startswith("s3"):
        server = request.getfixturevalue("s3_server")
        blob = server.blob_uri(server.new_bucket(), "shard")
    else:
        blob = datadir.blob_uri(data)
    consensus = datadir.consensus_uri(data)
    if where in ("data-dir", "s3"):
        argv = ["--data-dir", str(data), *(["--blob", blob] if where == "s3" else [])]
        yield argv, {"blob": blob, "consensus": consensus}, None
        return
    # compaction by hand only, so the history it checks is exactly what the test did
    with serving(tmp_path, open_blob(blob), consensus=consensus, compact_interval_s=0) as server:
        stores = {"blob": blob, "consensus": server.address}
        if where == "lock":
            with datadir.acquire(data, datadir.CONSENSUS_SERVER) as lock:
                lock.update(address=server.address)
                yield ["--data-dir", str(data)], stores, server
        else:
            yield ["--consensus", server.address, "--blob", blob], stores, server


def run(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def manifest_connection(manifest: dict, s3_server) -> duckdb.DuckDBPyConnection:
    """DuckDB, able to read the manifest's part URIs: for S3 parts, through
    a client set up from the manifest's ``s3`` settings (and the server's
    credentials, which a manifest never carries)."""
    connection = duckdb.connect()
    settings = manifest.get("s3")
    if settings is not None:
        assert set(settings) == {"endpoint", "use_ssl", "url_style", "region"}
        client = pafs.S3FileSystem(
            access_key=s3_server.access_key,
            secret_key=s3_server.secret_key,
            endpoint_override=settings["endpoint"],
            scheme="https" if settings["use_ssl"] else "http",
            region=settings["region"],
        )
        connection.register_filesystem(_S3(client))
    return connection


def four_ways(
    capsys, stores: list[str], shard_stores: dict, out: Path, s3_server
) -> dict[str, pa.Table]:
    """The snapshot at the upper through the API, ``read``, ``export`` +
    DuckDB and the manifest's SQL, cast to the shard's schema."""
    with open_shard(**shard_stores, create=False) as shard:
        api = shard.snapshot()
        schema = api.schema
    read = out / "read.parquet"
    run(capsys, "read", *stores, "--format", "parquet", "--output", str(read))
    export = out / "export"
    run(capsys, "export", *stores, "--output", str(export), "--file-rows", "700")
    manifest = json.loads(run(capsys, "shard", "manifest", *stores, "--json"))
    assert "access_key" not in json.dumps(manifest) and "secret" not in json.dumps(manifest)
    by_sql = manifest_connection(manifest, s3_server).sql(manifest["sql"]).to_arrow_table()
    exported = duckdb.sql(
        f"select * from read_parquet('{export}/*.parquet') order by key, val"
    ).to_arrow_table()
    return {
        "api": api,
        "read": duckdb.sql(f"select * from read_parquet('{read}')").to_arrow_table(),
        "export": exported.cast(schema),
        "manifest": by_sql.cast(schema),
        "parts": len(manifest["parts"]),
    }


@pytest.mark.parametrize(
    "where",
    [
        "data-dir",
        "lock",
        "address",
        *(pytest.param(w, marks=pytest.mark.s3) for w in ("s3", "s3+address")),
    ],
)
def test_api_read_export_and_manifest_equal_the_churn_collection(where, tmp_path, capsys, request):
    expected = CHURN.expected(INTERVALS)
    s3_server = request.getfixturevalue("s3_server") if where.startswith("s3") else None
    with located(where, tmp_path, request) as (stores, shard_stores, server):
        with open_shard(**shard_stores, config=SMALL_PARTS, create=True) as shard:
            writer = shard.writer()
            for i in range(INTERVALS):
                t = i * CHURN.interval_ms
                writer.compare_and_append_table(CHURN.updates(i), t, t + CHURN.interval_ms)
        seen = {}
        for stage in ("before", "after"):
            if stage == "after":
                assert json.loads(run(capsys, "shard", "compact", *stores))["applied"] >= 1
                assert json.loads(run(capsys, "shard", "gc", *stores, "--json"))["blobs_deleted"]
            (tmp_path / stage).mkdir()
            served = server and server.requests
            seen[stage] = four_ways(capsys, stores, shard_stores, tmp_path / stage, s3_server)
            # read, export and manifest each open the shard and lease through the server
            assert server is None or server.requests >= served + 3 * 3
            for way in ("api", "read", "export", "manifest"):
                assert seen[stage][way].equals(expected), (stage, way)
        assert seen["after"]["parts"] < seen["before"]["parts"]
        history = json.loads(run(capsys, "shard", "history", *stores, "--json"))
    appends, merges = history[:INTERVALS], history[INTERVALS:]
    assert [e["upper"] for e in appends] == [(i + 1) * CHURN.interval_ms for i in range(INTERVALS)]
    assert all(e["writer"] and len(e["added"]) == 1 for e in appends)
    assert len(merges) == 1 and merges[0]["writer"] is None
    assert sorted(merges[0]["replaced"]) == sorted(e["added"][0]["batch"] for e in appends)


def test_history_pages_through_a_servers_capped_answers(tmp_path, monkeypatch):
    """A server answers at most ``MAX_SCAN_VERSIONS`` versions a request;
    history asks again from the next seqno until none is left, and equals
    the history read from the store itself."""
    monkeypatch.setattr(server_module, "MAX_SCAN_VERSIONS", 2)
    blob, consensus = datadir.blob_uri(tmp_path), datadir.consensus_uri(tmp_path)
    with (
        serving(tmp_path, open_blob(blob), consensus=consensus, compact_interval_s=0) as server,
        open_shard(blob=blob, consensus=server.address, create=True) as shard,
    ):
        writer = shard.writer()
        for i in range(5):
            writer.compare_and_append_table(CHURN.updates(i), i * 10, (i + 1) * 10)
        assert len(shard.machine.versions(0, 100)) == 2
        with pytest.raises(ValueError, match="limit must be >= 1, got 0"):
            shard.machine.versions(0, 0)
        served = shard.history(limit=4)
    with open_shard(blob=blob, consensus=consensus, create=True) as local:
        assert served == local.history(limit=4)
    assert [e["upper"] for e in served] == [20, 30, 40, 50]
