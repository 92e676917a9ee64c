"""A writer of one shard for the lease tests, run on an emulated host:
``python -m tests.emulated.writer_on_host SHARD CONSENSUS NAME`` (the blob
URI and the CURVE keys in its environment, as a coordinator's).

It registers a writer through the consensus server, heartbeats it every
``--heartbeat-s`` in a thread, then answers one JSON line on stdout per
line on stdin:

- ``{"append": [lower, upper, first_key, rows]}``: ``rows`` rows, keys from
  ``first_key``, compare-and-appended from ``lower`` to ``upper``:
  ``{"outcome": "ok"}`` or the exception's class name and message;
- ``{"status": true}``: ``{"writer_id", "heartbeats", "heartbeat_errors",
  "wall"}`` (``wall``: this process's ``time.time()``, its host's clock).

It says ``{"ready": writer_id}`` first; stdin closed, it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import pyarrow as pa

import shardsink
from shardsink.persist.config import ShardConfig
from shardsink.storage.uri import BLOB_ENV

SCHEMA = pa.schema([("key", pa.int64()), ("val", pa.string())])


def rows(lower: int, first_key: int, n: int) -> pa.Table:
    return pa.table({
        "key": pa.array(range(first_key, first_key + n), pa.int64()),
        "val": [f"v{k}" for k in range(first_key, first_key + n)],
        "ts": pa.array([lower] * n, pa.uint64()),
        "diff": pa.array([1] * n, pa.int64()),
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shard")
    parser.add_argument("consensus")
    parser.add_argument("name")
    parser.add_argument("--heartbeat-s", type=float, default=0.5)
    parser.add_argument("--timeout-s", type=float, default=1.0)
    parser.add_argument("--retry-for-s", type=float, default=60.0)
    args = parser.parse_args()
    config = ShardConfig(server_timeout_s=args.timeout_s, server_retry_for_s=args.retry_for_s)
    say_lock = threading.Lock()

    def say(message: dict) -> None:
        with say_lock:
            print(json.dumps(message), flush=True)

    blob = os.environ[BLOB_ENV]
    with shardsink.open_shard(
        args.shard, blob=blob, consensus=args.consensus, schema=SCHEMA, config=config
    ) as shard:
        writer = shard.writer(args.name)
        beats = {"ok": 0, "errors": []}
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(args.heartbeat_s):
                try:
                    writer.heartbeat()
                    beats["ok"] += 1
                except Exception as exc:  # reported by status
                    beats["errors"].append(type(exc).__name__)

        beating = threading.Thread(target=heartbeat, daemon=True)
        beating.start()
        say({"ready": writer.writer_id})
        for line in sys.stdin:
            request = json.loads(line)
            if "append" in request:
                lower, upper, first, n = request["append"]
                try:
                    writer.compare_and_append_table(rows(lower, first, n), lower, upper)
                    say({"outcome": "ok"})
                except Exception as exc:
                    say({"outcome": type(exc).__name__, "detail": str(exc)})
            else:
                say({
                    "writer_id": writer.writer_id, "heartbeats": beats["ok"],
                    "heartbeat_errors": beats["errors"], "wall": time.time(),
                })  # fmt: skip
        stop.set()


if __name__ == "__main__":
    main()
