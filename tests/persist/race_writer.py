"""One writer process of the race test (run as a script).

Usage: ``race_writer.py BLOB_URI CONSENSUS_URI N NAME``. Opens shard ``race``
as writer ``NAME`` and prints ``ready``. Then, for each line it reads on
stdin (one per round of the race), it tries to append the trickle rows of
interval ``i`` (``[i, i+1)``, starting at 0) with expected upper ``i``, and
prints one JSON line: ``{"interval": i, "won": true}``, or on an upper
mismatch ``{"interval": i, "won": false, "actual": upper}``, after which it
moves on to the actual upper. Exits 0 once the upper reaches N.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa

from shardsink import open_shard
from shardsink.persist import UpperMismatch

ROWS = 4


def rows(i: int) -> pa.Table:
    keys = list(range(i * ROWS, (i + 1) * ROWS))
    return pa.table(
        {
            "key": pa.array(keys, pa.int64()),
            "val": [format(k, "032x") for k in keys],
            "ts": pa.array([i] * ROWS, pa.uint64()),
            "diff": pa.array([1] * ROWS, pa.int64()),
        }
    )


def main(blob: str, consensus: str, n: int, name: str) -> None:
    with open_shard("race", blob=blob, consensus=consensus, create=True) as shard:
        writer = shard.writer(name)
        print("ready", flush=True)
        i = 0
        while i < n and sys.stdin.readline():
            try:
                writer.compare_and_append_table(rows(i), i, i + 1)
                result = {"interval": i, "won": True}
                i += 1
            except UpperMismatch as exc:
                result = {"interval": i, "won": False, "actual": exc.actual}
                i = exc.actual
            print(json.dumps(result), flush=True)
    sys.exit(0 if i >= n else f"{name}: stdin closed at interval {i} of {n}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
