"""The history of a chaos run: the writer, the strict reader, and an op
on one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import pytest

from shardsink.chaos.history import HistoryError, HistoryWriter, Op, describe, load

MS = 1_000_000


class _Ops:
    """Builds a history by hand, times in ms."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def append(self, process, token, lower, upper, at, until, outcome="ok", actual=None, **kw):
        writer = kw.pop("writer", process)
        return self._add(
            process, "append", at, until, outcome, writer=writer, token=token, lower=lower,
            upper=upper, actual=actual, **kw,
        )  # fmt: skip

    def read(self, process, at, until, upper=None, outcome="ok", **kw):
        return self._add(process, "read", at, until, outcome, upper=upper, **kw)

    def _add(self, process, kind, at, until, outcome, shard="s", **fields) -> Op:
        op = Op(
            id=str(len(self.ops)), process=process, shard=shard, kind=kind, invoke_ns=at * MS,
            complete_ns=None if until is None else until * MS, outcome=outcome, **fields,
        )  # fmt: skip
        self.ops.append(op)
        return op


# --- the history file ---------------------------------------------------------


def test_the_writer_records_invocations_then_outcomes(tmp_path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as history:
        a = history.invoke(process="c0", shard="s", kind="append", writer="w", token="t",
                           lower=0, upper=10)  # fmt: skip
        r = history.invoke(process="r0", shard="s", kind="read")
        gone = history.invoke(process="r1", shard="s", kind="read")
        done = history.complete(a, "mismatch", actual=20)
        history.complete(r, "ok", upper=20)
        with pytest.raises(ValueError, match="completed already"):
            history.complete(r, "ok", upper=20)
        with pytest.raises(ValueError, match="a read has an upper iff it is ok"):
            history.complete(gone, "ok")
        with pytest.raises(ValueError, match="an append needs"):
            history.invoke(process="c0", shard="s", kind="append", writer="w", lower=0, upper=1)
    history.close()  # again: nothing
    assert history.complete(gone, "ok", upper=20) is None  # the run has ended: stays open
    with pytest.raises(ValueError, match="closed"):
        history.invoke(process="r0", shard="s", kind="read")
    assert len(path.read_text().splitlines()) == 5
    ops = load(path)
    assert ops[0] == done and done.complete_ns >= done.invoke_ns
    assert (ops[1].outcome, ops[1].upper) == ("ok", 20)
    assert (ops[2].outcome, ops[2].complete_ns) == ("info", None)
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_writers_in_threads_never_interleave_lines(tmp_path) -> None:
    path = tmp_path / "history.jsonl"
    shared, other = HistoryWriter(path), HistoryWriter(path)  # as two processes would

    def client(history: HistoryWriter, name: str) -> None:
        for _ in range(300):
            h = history.invoke(process=name, shard="s", kind="read")
            history.complete(h, "ok", upper=len(name) * 1000)

    threads = [threading.Thread(target=client, args=(shared, f"r{i}")) for i in range(4)]
    threads.append(threading.Thread(target=client, args=(other, "other")))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared.close()
    other.close()
    ops = load(path)
    assert len(ops) == 1500 and len({op.id for op in ops}) == 1500
    assert all(op.outcome == "ok" for op in ops)


def test_a_killed_client_leaves_its_operation_as_info(tmp_path) -> None:
    path = tmp_path / "history.jsonl"
    code = (
        "import os, signal, sys\n"
        "from shardsink.chaos.history import HistoryWriter\n"
        "h = HistoryWriter(sys.argv[1])\n"
        "h.complete(h.invoke(process='c0', shard='s', kind='read'), 'ok', upper=0)\n"
        "h.invoke(process='c0', shard='s', kind='append', writer='w', token='t', lower=0,"
        " upper=10)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], check=False)
    assert proc.returncode == -signal.SIGKILL
    read, append = load(path)
    assert read.outcome == "ok" and (append.outcome, append.complete_ns) == ("info", None)


def _bad_line(tmp_path, lines: list[str]) -> str:
    path = tmp_path / "history.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(HistoryError) as caught:
        load(path)
    return str(caught.value)


def test_the_reader_is_strict_and_names_the_line(tmp_path) -> None:
    good = {"id": "1", "process": "r0", "shard": "s", "kind": "read", "invoke_ns": 5,
            "complete_ns": None, "outcome": "info"}  # fmt: skip
    done = {**good, "complete_ns": 9, "outcome": "ok", "upper": 0}
    line = json.dumps
    cases = {
        "unknown field": ([line(good), line({**done, "extra": 1})], ":2: Object contains"),
        "wrong type": ([line({**good, "invoke_ns": "5"})], ":1: Expected `int`"),
        "inconsistent": ([line({**good, "outcome": "ok"})], ":1: op '1' of 'r0': complete_ns"),
        "cut line": ([line(good)[:30]], ":1: "),
        "blank line": ([line(good), ""], ":2: "),
        "never invoked": ([line(done)], ":1: op '1': completes an op never invoked"),
        "twice": ([line(good), line(done), line(done)], ":3: op '1': recorded twice (line 1)"),
        "other op": ([line(good), line({**done, "invoke_ns": 6})], ":2: op '1': its completion"),
    }
    for name, (lines, expected) in cases.items():
        message = _bad_line(tmp_path, lines)
        assert f"history.jsonl{expected}" in message, (name, message)


def test_describe_puts_an_op_on_one_line() -> None:
    h = _Ops()
    a = h.append("c0", "a1", 0, 10, at=2, until=None, outcome="info")
    m = h.append("c1", "b1", 0, 10, at=3, until=4.5, outcome="mismatch", actual=10)
    r = h.read("r0", 5, 6, upper=10)
    assert describe(a, 1 * MS) == "[1.000, never] ms  c0  append(c0, a1, 0 -> 10) -> info"
    assert (
        describe(m, 0) == "[3.000, 4.500] ms  c1  append(c1, b1, 0 -> 10) -> mismatch (actual 10)"
    )
    assert describe(r, 0) == "[5.000, 6.000] ms  r0  read -> ok 10"
