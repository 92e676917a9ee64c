"""One writer process of the race test (run as a script).

Usage: ``race_writer.py BLOB_URI CONSENSUS_URI N NAME``. Opens shard ``race``,
prints ``ready``, waits for a line on stdin, then for each interval
``[i, i+1)`` from 0 to N appends the trickle rows of ``i`` with expected
upper ``i``; on an upper mismatch it moves on to the actual upper. Prints one
JSON line: the intervals it appended and the mismatches it saw. A short
seeded random pause before each attempt lets both writers win intervals.
"""

from __future__ import annotations

import json
import random
import sys
import time

import pyarrow as pa

from shardsink.persist import UpperMismatch, open_shard

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
    won, mismatches = [], []
    with open_shard("race", blob=blob, consensus=consensus) as shard:
        writer = shard.writer(name)
        print("ready", flush=True)
        sys.stdin.readline()
        pause = random.Random(name)
        i = 0
        while i < n:
            time.sleep(pause.uniform(0, 0.003))  # let the two writers interleave
            try:
                writer.compare_and_append_table(rows(i), i, i + 1)
                won.append(i)
                i += 1
            except UpperMismatch as exc:
                mismatches.append([i, exc.actual])
                i = exc.actual
        stats = shard.stats()
    result = {"won": won, "mismatches": mismatches, "cas_calls": stats.cas_calls}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
