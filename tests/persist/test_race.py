"""Two writer processes race compare-and-append for the same intervals, on
the real SQLite and PostgreSQL engines: in each round both try to append the
same interval against the same expected upper at once. Exactly one wins it,
the other gets a mismatch naming the winner's upper, and over the race each
writer wins some intervals."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from race_writer import ROWS

from shardsink import open_shard

N = 60
SCRIPT = Path(__file__).with_name("race_writer.py")
LINE_TIMEOUT_S = 60.0


class Writer:
    """A race_writer.py process, its output lines read with a deadline."""

    def __init__(self, popen, blob: str, consensus: str, name: str) -> None:
        self.proc = popen(
            [sys.executable, str(SCRIPT), blob, consensus, str(N), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def line(self) -> str:
        return self.lines.get(timeout=LINE_TIMEOUT_S).strip()

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()


def race(popen, blob: str, consensus: str) -> list[list[dict]]:
    """The race, round by round: what each writer's attempt came to. Which
    writer is released first alternates, so neither always has a head start
    (of a pipe write: both attempts are in flight at once)."""
    writers = [Writer(popen, blob, consensus, f"writer-{k}") for k in range(2)]
    for writer in writers:
        assert writer.line() == "ready"
    rounds = []
    for i in range(N):
        for writer in writers[i % 2 :] + writers[: i % 2]:
            writer.go()
        rounds.append([json.loads(writer.line()) for writer in writers])
    for writer in writers:
        writer.proc.stdin.close()
        assert writer.proc.wait(LINE_TIMEOUT_S) == 0
    return rounds


def check(popen, blob: str, consensus: str) -> None:
    rounds = race(popen, blob, consensus)
    wins = [0, 0]
    for i, attempts in enumerate(rounds):
        assert [a["interval"] for a in attempts] == [i, i], attempts
        won = [a["won"] for a in attempts]
        assert sorted(won) == [False, True], attempts  # exactly one winner per interval
        loser = attempts[won.index(False)]
        assert loser["actual"] == i + 1, attempts  # the mismatch names the winner's upper
        wins[won.index(True)] += 1
    assert min(wins) > 0, f"one writer won every interval: {wins}"
    with open_shard("race", blob=blob, consensus=consensus, create=False) as shard:
        assert shard.upper == N
        snap = shard.reader().snapshot()
        keys = list(range(N * ROWS))
        assert snap["key"].to_pylist() == keys
        assert snap["val"].to_pylist() == [format(k, "032x") for k in keys]
        assert set(snap["diff"].to_pylist()) == {1}
        assert set(snap["ts"].to_pylist()) == {N - 1}
        assert sum(b.rows for b in shard.state().batches.values()) == N * ROWS


def test_two_writer_processes_race_on_sqlite(tmp_path, popen):
    check(popen, f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/consensus.db")


@pytest.mark.postgres
def test_two_writer_processes_race_on_postgres(tmp_path, popen, postgres_server):
    check(popen, f"file://{tmp_path}/blob", postgres_server.new_database())
