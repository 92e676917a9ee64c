"""With ``--json`` (and for ``read``) stdout holds the document alone,
whatever a child or a library prints meanwhile (issue 41: a Ray node's death
notice, printed by Ray's driver to stdout, came before ``up --json``'s
summary, so no JSON reader could parse it)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers.cli import ENV

#: A workload that writes to stdout in every way a library can: Python's
#: print, the descriptor itself, and a thread of its own that prints on (as
#: Ray's driver does when a node dies), in the coordinator and in each child.
NOISY = """
import os
import sys
import threading
import time

import pyarrow as pa

print("noise: printed at import")
os.write(1, b"noise: written to fd 1 at import\\n")


def _chatter():
    while True:
        print("noise: printed by a thread", flush=True)
        os.write(1, b"noise: written to fd 1 by a thread\\n")
        time.sleep(0.02)  # noise all along the run, not a flood


class Noisy:
    schema = pa.schema([("key", pa.int64()), ("val", pa.string())])

    def __init__(self):
        threading.Thread(target=_chatter, daemon=True).start()

    def updates(self, interval, worker, workers):
        print("noise: printed in updates")
        sys.stdout.flush()
        keys = list(range(interval * 100 + worker, (interval + 1) * 100, workers))
        return pa.table({"key": pa.array(keys, pa.int64()), "val": [str(k) for k in keys]})
"""


def _shardsink(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardsink.cli", *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_up_json_is_the_summary_alone_whatever_is_printed_meanwhile(tmp_path):
    (tmp_path / "noisy.py").write_text(textwrap.dedent(NOISY))
    data = str(tmp_path / "d")
    done = _shardsink(
        "up", "--data-dir", data, "--groups", "1", "--workers", "2", "--intervals", "3",
        "--workload", f"{tmp_path / 'noisy.py'}:Noisy", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1, done.stdout[:500]
    stats = json.loads(done.stdout)
    assert (stats["appends"], stats["verified"]) == (3, True)
    for noise in ("printed at import", "written to fd 1 at import", "printed by a thread"):
        assert f"noise: {noise}" in done.stderr  # it was printed, to stderr

    read = _shardsink("read", "--data-dir", data, "--format", "jsonl")
    assert read.returncode == 0, read.stderr
    rows = [json.loads(line) for line in read.stdout.splitlines()]
    assert len(rows) == 300 and {r["key"] for r in rows} == set(range(300))
