"""The history of a chaos run and its linearizability check.

Hand-written histories: valid concurrent ones the checker must accept, and
corrupted ones it must reject, each with a short failing sub-history naming
the culprit ops. Then histories of a simulated shard (a real linearizable
register, concurrent clients, lost replies): always valid, and with one
corruption injected, invalid whenever the corruption is detectable at all:

- a stale read (of an upper an append completed before the read began had
  moved past), a future read (of an upper no append invoked before the
  read completed could make), a mismatch whose actual the upper never was,
  a lost update (a mismatch recorded as ok where another append from the
  same lower committed), an ``already`` for a token never sent again
  once the upper is past its lower: always detectable, and the witness
  names the corrupted op;
- an ok recorded as mismatch seeing its own upper: detectable when no
  ``info`` append from the same lower could have moved the upper (the
  witness may name an op that saw its effect instead of the op itself).

Not detectable, as a history cannot tell: a stale read concurrent with the
append that moved the upper (it may linearize first), a future read of an
append in flight, an outcome an ``info`` op of the same effect explains,
and anything turned into ``fail`` or ``info`` (they may not have happened).

``python -m tests.chaos.test_linearizability`` measures the checker on a
history the size of a 300 s chaos run (the figures in
shardsink/chaos/linearizability.py and docs/chaos.md).
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from shardsink.chaos.linearizability import Register, Result, ShardModel, check, verdict
from shardsink.server.history import HistoryError, HistoryWriter, Op, describe, load

MS = 1_000_000

# --- hand-written histories ---------------------------------------------------


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


def _valid(ops: list[Op]) -> Result:
    result = check(ops)
    assert result.valid, "\n".join(result.lines())
    return result


def _witness(ops: list[Op]) -> tuple[str, str]:
    """The failing sub-history the checker prints: the states it starts from
    (with the ops that led there), and the ops that cannot be linearized."""
    result = check(ops)
    assert not result.valid
    (bad,) = [s for s in result.shards if s.valid is False]
    assert verdict(result, appended_ops=100, min_ops=1).verdict == "invalid"
    start, culprits = "\n".join(bad.witness).split("no order of these fits")
    return start, culprits


def _line(op: Op, ops: list[Op]) -> str:
    return describe(op, min(o.invoke_ns for o in ops))


def test_racing_appends_one_wins_the_other_sees_its_upper() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=5)
    h.append("c1", "b1", 0, 10, at=1, until=4, outcome="mismatch", actual=10)  # answered first
    h.read("r0", 2, 3, upper=0)  # concurrent with the winner: before it
    h.read("r1", 2, 6, upper=10)
    h.append("c1", "b2", 10, 20, at=6, until=8)
    h.read("r0", 9, 10, upper=20)
    result = _valid(h.ops)
    assert (result.shards[0].ops, result.shards[0].info) == (6, 0)


def test_info_ops_that_took_effect_and_ones_that_did_not() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=50, outcome="info")  # took effect: c1 sees it
    h.append("c1", "b1", 0, 10, at=60, until=61, outcome="mismatch", actual=10)
    h.append("c1", "b2", 10, 20, at=62, until=None, outcome="info")  # never completed, no effect
    h.append("c0", "a2", 10, 20, at=70, until=71)
    h.read("r0", 72, 73, upper=20)
    h.append("c1", "c1", 20, 30, at=74, until=75, outcome="info")  # did, seen by a late read
    h.read("r0", 76, 77, upper=20)  # after it completed: its effect may come later still
    h.read("r0", 80, 81, upper=30)
    h.read("r1", 82, None, outcome="info")  # dropped: a read that never completed
    h.append("c0", "a3", 20, 30, at=83, until=84, outcome="fail")  # dropped: did not happen
    result = _valid(h.ops)
    assert (result.shards[0].ops, result.shards[0].info, result.shards[0].dropped) == (8, 3, 2)


def test_an_already_may_be_its_own_commit() -> None:
    """The server's store call failed not knowing whether it stored; its
    retry found the token applied and answered ``already``: the op's own
    commit, which a read after it sees."""
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1)
    h.append("c0", "a2", 10, 20, at=2, until=5, outcome="already")
    h.read("r0", 6, 7, upper=20)
    _valid(h.ops)


def test_a_retry_is_answered_already_and_changes_nothing() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=5, outcome="info")
    h.append("c0", "a1", 0, 10, at=6, until=7, outcome="already")
    h.append("c0", "a2", 10, 20, at=8, until=9, outcome="info")  # did not take effect
    h.append("c0", "a2", 10, 20, at=10, until=11)  # so the retry commits
    h.append("c0", "a2", 10, 20, at=12, until=13, outcome="already")
    h.read("r0", 14, 15, upper=20)
    _valid(h.ops)


def test_shards_are_checked_apart() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1, shard="s0")
    h.append("c1", "b1", 0, 10, at=2, until=3, shard="s1")  # the same lower, another shard
    h.read("r0", 4, 5, upper=10, shard="s0")
    result = _valid(h.ops)
    assert [(s.shard, s.ops) for s in result.shards] == [("s0", 2), ("s1", 1)]


def test_ops_meeting_at_one_instant_are_concurrent() -> None:
    """The clocks are read around a call, not at its effect: an op invoked
    at the very ns another completed may linearize before it."""
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=5)
    h.read("r0", 5, 6, upper=0)
    h.read("r1", 7, 9, upper=20)
    h.append("c1", "b1", 10, 20, at=9, until=None, outcome="info")
    _valid(h.ops)


def test_a_stale_read_is_rejected_naming_the_read_and_the_append_it_missed() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1)
    for t in range(2, 40, 2):
        h.read("r0", t, t + 1, upper=10)
    moved = h.append("c0", "a2", 10, 20, at=40, until=41)
    h.read("r0", 42, 43, upper=20)
    stale = h.read("r1", 44, 48, upper=10)
    h.read("r0", 45, 46, upper=20)  # right, and within the stale read: not named
    start, culprits = _witness(h.ops)
    assert _line(moved, h.ops) in start and "upper 20" in start
    assert culprits.splitlines()[1:] == [f"  {_line(stale, h.ops)}"]  # not the right reads


def test_a_lost_update_is_rejected_naming_both_appends() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1)
    first = h.append("c0", "a2", 10, 20, at=2, until=5)
    second = h.append("c1", "b1", 10, 20, at=3, until=6)  # both ok from 10
    h.read("r0", 7, 8, upper=20)
    start, culprits = _witness(h.ops)
    assert culprits.splitlines()[1:] == [f"  {_line(first, h.ops)}", f"  {_line(second, h.ops)}"]
    # from before both: the first, under way when the second began, is not summed up twice
    assert "leave the shard in 1 state:\n  upper 10  (" in start


def test_an_ok_recorded_as_mismatch_while_the_upper_was_its_lower_is_rejected() -> None:
    for actual in (10, 20):  # its lower, or its own upper as if another had appended
        h = _Ops()
        h.append("c0", "a1", 0, 10, at=0, until=1)
        h.read("r0", 2, 3, upper=10)
        flipped = h.append("c0", "a2", 10, 20, at=4, until=5, outcome="mismatch", actual=actual)
        h.read("r0", 6, 7, upper=20)
        _, culprits = _witness(h.ops)
        assert culprits.splitlines()[1:] == [f"  {_line(flipped, h.ops)}"]


def test_a_mismatch_with_a_wrong_actual_is_rejected() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1)
    h.append("c0", "a2", 10, 20, at=2, until=3)
    wrong = h.append("c1", "b1", 0, 10, at=4, until=5, outcome="mismatch", actual=10)  # was 20
    h.read("r0", 6, 7, upper=20)
    start, culprits = _witness(h.ops)
    assert culprits.splitlines()[1:] == [f"  {_line(wrong, h.ops)}"]
    assert "upper 20  (e.g. after" in start and "a2" in start  # what it should have seen


def test_already_for_a_token_never_applied_is_rejected() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1)
    h.append("c0", "a2", 10, 20, at=2, until=3, outcome="info", writer="c0")
    h.append("c1", "b1", 10, 20, at=4, until=5)  # so a2 did not take effect
    never = h.append("c0", "a2", 10, 20, at=6, until=7, outcome="already")
    start, culprits = _witness(h.ops)
    assert culprits.splitlines()[1:] == [f"  {_line(never, h.ops)}"]
    assert "upper 20  (e.g. after" in start and "b1" in start  # a2 is no writer's last token
    # an already for a token applied before, but not the writer's last, is wrong too
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1)
    h.append("c0", "a2", 10, 20, at=2, until=3)
    old = h.append("c0", "a1", 0, 10, at=4, until=5, outcome="already")
    assert _witness(h.ops)[1].splitlines()[1:] == [f"  {_line(old, h.ops)}"]


def test_what_no_later_op_can_tell_apart_does_not_multiply_the_search() -> None:
    """12 rounds, each with an append's two info tries (the same token: which
    one took effect, no op can tell) and two coordinators killed mid-append
    from one lower (lone tokens: which won, no op can tell); a read sees the
    upper move. Remembered apart, each round would double what follows."""
    h = _Ops()
    for j in range(12):
        t, low = 100 * j, 20 * j
        h.append("c0", f"a{j}", low, low + 10, at=t, until=t + 5, outcome="info")
        h.append("c0", f"a{j}", low, low + 10, at=t + 6, until=None, outcome="info")
        h.read("r0", t + 20, t + 21, upper=low + 10)
        h.append(f"c{j}.x", "x", low + 10, low + 20, at=t + 30, until=None, outcome="info")
        h.append(f"c{j}.y", "y", low + 10, low + 20, at=t + 31, until=None, outcome="info")
        h.read("r0", t + 50, t + 51, upper=low + 20)
    assert _valid(h.ops).shards[0].steps < 100
    h.read("r0", 2000, 2001, upper=0)  # so every way through is tried
    (shard,) = check(h.ops).shards
    assert shard.valid is False and shard.steps < 200


def test_reads_around_a_stale_one_do_not_multiply_the_search() -> None:
    """16 right reads under way when a stale one began: placing one changes
    nothing, so the search takes each at once where it must be placed (not
    in every order), and the minimisation never where it may be."""
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1)
    h.append("c0", "a2", 10, 20, at=2, until=3)
    for i in range(16):
        h.read(f"r{i}", 150 + i, 250, upper=20)
    stale = h.read("stale", 200, 210, upper=10)
    _, culprits = _witness(h.ops)
    assert culprits.splitlines()[1:] == [f"  {_line(stale, h.ops)}"]
    assert check(h.ops).shards[0].steps < 100  # 54; not taking each read at once: 310


class _Bounded:
    """A toy model for the search alone: a counter that an append (ok or
    info) raises by one while it is at most the append's ``lower``; a read
    returns it. No hint: ``needs`` and ``offers`` tell nothing."""

    def initial(self) -> int:
        return 0

    def step(self, state: int, op: Op) -> int | None:
        if op.kind == "read":
            return state if op.upper == state else None
        assert op.lower is not None
        return state + 1 if state <= op.lower else None

    def needs(self, op: Op) -> None:
        return None

    def offers(self, state: int) -> None:
        return None


def test_the_search_remembers_which_optional_ops_it_used() -> None:
    """Any model works; and two ways to one state that used different info
    ops are two configurations: x first leaves y nothing to do (the counter
    is past 0), y first leaves x room, and only that way reads 3."""
    h = _Ops()
    h.append("c0", "x", 5, 6, at=0, until=None, outcome="info")
    h.append("c1", "y", 0, 1, at=1, until=None, outcome="info")
    h.append("c2", "z", 5, 6, at=10, until=11)
    h.read("r0", 12, 13, upper=3)
    assert check(h.ops, _Bounded()).valid
    h.read("r0", 14, 15, upper=4)
    assert not check(h.ops, _Bounded()).valid


def test_the_budget_gives_an_undecided_verdict_never_a_hang() -> None:
    ops = simulate(3, Shape(writers=3, readers=3, duration_ms=400.0, info_p=0.3))
    result = check(ops, max_steps=50)
    (shard,) = result.shards
    assert not result.valid and shard.valid is None and shard.steps == 51
    judged = verdict(result, appended_ops=100, min_ops=1)
    assert judged.verdict == "unknown" and "max_steps" in judged.reason


def test_the_verdict() -> None:
    h = _Ops()
    h.append("c0", "a1", 0, 10, at=0, until=1)
    assert verdict(check(h.ops), appended_ops=1, min_ops=1).verdict == "valid"
    few = verdict(check(h.ops), appended_ops=1, min_ops=5)
    assert few.verdict == "unknown" and "fewer than 5" in few.reason
    h.read("r0", 2, 3, upper=0)
    bad = verdict(check(h.ops), appended_ops=1, min_ops=5)  # a violation is one, however few
    assert bad.verdict == "invalid" and bad.reason.startswith("shard s: 1 op cannot")


def test_the_shard_model_is_the_servers_rule() -> None:
    """Token first, then the upper, as ``transitions._compare_and_append``."""
    model = ShardModel()
    h = _Ops()
    ok = h.append("c0", "a1", 0, 10, at=0, until=1)
    state = model.step(model.initial(), ok)
    assert state is not None and state.upper == 10
    again = h.append("c0", "a1", 0, 10, at=2, until=3)  # the same token: already, not ok
    assert model.step(state, again) is None
    assert model.step(state, msgspec.structs.replace(again, outcome="already")) == state
    late = h.append("c0", "a1", 5, 10, at=2, until=3, outcome="mismatch", actual=10)
    assert model.step(state, late) is None  # a repeated token never sees a mismatch
    info = h.append("c1", "b1", 0, 10, at=4, until=None, outcome="info")
    assert model.step(state, info) is None  # cannot take effect: the same as left out


@settings(max_examples=300, deadline=None)
@given(
    upper=st.integers(0, 3),
    tokens=st.frozensets(st.tuples(st.sampled_from("wv"), st.sampled_from("tu"))),
    fields=st.fixed_dictionaries({
        "kind": st.sampled_from(["append", "read"]),
        "outcome": st.sampled_from(["ok", "already", "mismatch", "info"]),
        "writer": st.sampled_from("wv"), "token": st.sampled_from("tu"),
        "lower": st.integers(0, 3), "upper": st.integers(0, 4), "actual": st.integers(0, 3),
    }),
    retried=st.booleans(),
)  # fmt: skip
def test_the_shard_models_hint_is_a_necessary_condition(upper, tokens, fields, retried) -> None:
    """What a state offers is what an op that steps from it needs, and never goes down."""
    if fields["kind"] == "read":
        fields = {"kind": "read", "outcome": fields["outcome"], "upper": fields["upper"]}
    fields["actual"] = fields.get("actual") if fields["outcome"] == "mismatch" else None
    try:
        op = Op(id="1", process="p", shard="s", invoke_ns=0, complete_ns=1, **fields)
    except ValueError:
        assume(False)
    model = ShardModel(frozenset([("w", "t")]) if retried else None)
    state = Register(upper, frozenset(dict(sorted(tokens)).items()))
    after = model.step(state, op)
    if after is not None:
        assert model.needs(op) in (None, model.offers(state))
        assert model.offers(after) >= model.offers(state)


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
        "from shardsink.server.history import HistoryWriter\n"
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


# --- simulated histories --------------------------------------------------------


class Shape(NamedTuple):
    """A simulated run: clients per shard, and how they behave (ms)."""

    writers: int = 2
    readers: int = 2
    shards: int = 1
    duration_ms: float = 60.0
    append_gap_ms: float = 3.0  # a writer's pause after an append, uniform in 0..2x
    read_gap_ms: float = 2.0
    latency_ms: float = 2.0  # to the server and back, each uniform in 0..x
    info_p: float = 0.1  # the reply is lost (the op applied or not, even odds)
    fail_p: float = 0.05  # a determinate error: nothing happened
    abandon_p: float = 0.2  # of info ops: the client dies, a new writer takes its place
    interval: int = 1000
    #: a commit answered already: the server's store call lost its answer,
    #: and its retry found the token it had written
    own_already_p: float = 0.05


class _Client:
    def __init__(self, name: str, shard: str, writes: bool) -> None:
        self.name, self.shard, self.writes = name, shard, writes
        self.generation = self.count = self.lower = 0
        self.retry: dict | None = None

    def call(self, interval: int) -> dict:
        if not self.writes:
            return {"kind": "read"}
        if self.retry is None:  # a retry after an error reuses its token
            self.count += 1
            self.retry = {"kind": "append", "writer": f"{self.name}.{self.generation}",
                          "token": f"t{self.count}", "lower": self.lower,
                          "upper": self.lower + interval}  # fmt: skip
        return self.retry

    def answered(self, op: Op) -> None:
        if op.kind == "append" and op.outcome not in ("fail", "info"):
            self.lower = op.actual if op.outcome == "mismatch" else op.upper
            self.retry = None


def simulate(seed: int, shape: Shape) -> list[Op]:
    """The history of concurrent clients of a linearizable shard register:
    each op takes effect at one moment between its invocation and its
    completion, in time order; writers append the next interval from the
    upper they last saw, and readers read."""
    rng = random.Random(seed)
    clients = [
        _Client(f"{role}-{i}", f"s{i % shape.shards}", role == "coordinator")
        for role, count in (("coordinator", shape.writers), ("reader", shape.readers))
        for i in range(count)
    ]
    upper: dict[str, int] = {}
    tokens: dict[str, str] = {}
    ops: list[Op] = []
    events: list[tuple[int, int, Callable[[int], None]]] = []
    order = itertools.count()
    ms = lambda x: int(rng.uniform(0, x) * MS)  # noqa: E731

    def at(t: int, then: Callable[[int], None]) -> None:
        heapq.heappush(events, (t, next(order), then))

    def invoke(client: _Client, t: int) -> None:
        if t > shape.duration_ms * MS:
            return
        args = client.call(shape.interval)
        fate = rng.choices(["fail", "info", "ok"], [shape.fail_p, shape.info_p, 1.0])[0]
        at(t + ms(shape.latency_ms), lambda now: serve(client, args, fate, t, now))

    def serve(client: _Client, args: dict, fate: str, t: int, now: int) -> None:
        result = {}
        if fate == "ok" or (fate == "info" and rng.random() < 0.5):
            result = apply(client.shard, args)
            own = args["kind"] == "append" and result["outcome"] == "ok"
            if own and rng.random() < shape.own_already_p:
                result = {"outcome": "already"}
        if fate != "ok":
            result = {"outcome": fate}
        gone = fate == "info" and rng.random() < shape.abandon_p
        end = None if gone else now + ms(shape.latency_ms)
        op = Op(id=str(len(ops)), process=client.name, shard=client.shard, invoke_ns=t,
                complete_ns=end, **{**args, "upper": args.get("upper"), **result})  # fmt: skip
        ops.append(op)
        if gone:  # dead: a new writer in its place, knowing nothing
            client.generation, client.lower, client.retry = client.generation + 1, 0, None
        else:
            client.answered(op)
        gap = shape.append_gap_ms if client.writes else shape.read_gap_ms
        wake = (end or now) + ms(2 * gap)
        at(wake, lambda now: invoke(client, now))

    def apply(shard: str, args: dict) -> dict:
        now = upper.get(shard, 0)
        if args["kind"] == "read":
            return {"outcome": "ok", "upper": now}
        key = f"{shard}/{args['writer']}"
        if tokens.get(key) == args["token"]:
            return {"outcome": "already"}
        if now != args["lower"]:
            return {"outcome": "mismatch", "actual": now}
        upper[shard], tokens[key] = args["upper"], args["token"]
        return {"outcome": "ok"}

    for client in clients:
        at(ms(shape.latency_ms), lambda now, c=client: invoke(c, now))
    while events:
        t, _, then = heapq.heappop(events)
        then(t)
    return ops


_SHAPES = st.builds(
    Shape,
    writers=st.integers(1, 3),
    readers=st.integers(0, 3),
    shards=st.integers(1, 2),
    duration_ms=st.floats(10.0, 150.0),
    append_gap_ms=st.floats(0.2, 4.0),
    read_gap_ms=st.floats(0.2, 4.0),
    latency_ms=st.floats(0.2, 4.0),
    info_p=st.floats(0.0, 0.3),
    fail_p=st.floats(0.0, 0.1),
    abandon_p=st.floats(0.0, 0.5),
    interval=st.just(1000),
)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shape=_SHAPES)
def test_a_simulated_linearizable_shard_gives_valid_histories(seed: int, shape: Shape) -> None:
    _valid(simulate(seed, shape))


def _appends(ops: list[Op], shard: str) -> list[Op]:
    return [a for a in ops if a.shard == shard and a.kind == "append"]


def _stale_read(ops: list[Op]) -> list[Op]:
    """Reads of an upper an ok append completed before the read began had left."""
    out = []
    for r in ops:
        if r.kind == "read" and r.outcome == "ok":
            left = [a.lower for a in _appends(ops, r.shard) if a.outcome == "ok"
                    and a.complete_ns < r.invoke_ns]  # fmt: skip
            out += [msgspec.structs.replace(r, upper=max(left))] if left else []
    return out


def _future_read(ops: list[Op]) -> list[Op]:
    """Reads of an upper above all that appends invoked before the read completed make."""
    out = []
    for r in ops:
        if r.kind == "read" and r.outcome == "ok":
            made = [a.upper for a in _appends(ops, r.shard) if a.invoke_ns <= r.complete_ns]
            out.append(msgspec.structs.replace(r, upper=max(made, default=0) + 1000))
    return out


def _wrong_actual(ops: list[Op]) -> list[Op]:
    """Mismatches seeing an upper that is never one (uppers are multiples of 1000)."""
    return [msgspec.structs.replace(m, actual=m.actual + 1) for m in ops if m.outcome == "mismatch"]


def _applied(ops: list[Op], op: Op) -> bool:
    """Whether another op of ``op``'s writer and token may have applied it."""
    return any(
        o is not op and (o.shard, o.writer, o.token) == (op.shard, op.writer, op.token)
        and o.outcome in ("ok", "already", "info")
        for o in ops
    )  # fmt: skip


def _lost_update(ops: list[Op]) -> list[Op]:
    """Mismatches recorded as ok, from a lower another append committed from."""
    return [
        msgspec.structs.replace(m, outcome="ok", actual=None)
        for m in ops
        if m.outcome == "mismatch"
        and any(a.outcome == "ok" and a.lower == m.lower for a in _appends(ops, m.shard))
    ]


def _already_never_applied(ops: list[Op]) -> list[Op]:
    """Mismatches recorded as already, whose token nothing else may have
    applied, and which could not have applied it themselves: an op that
    completed before they began saw the upper past their lower (an
    ``already`` may be its own commit, the server's retry finding the token
    its store call wrote)."""
    return [
        msgspec.structs.replace(m, outcome="already", actual=None)
        for m in ops
        if m.outcome == "mismatch" and _past_before(ops, m) and not _applied(ops, m)
    ]


def _past_before(ops: list[Op], op: Op) -> bool:
    """Whether an op that completed before ``op`` began saw its shard's
    upper past ``op``'s lower (the upper never goes back)."""

    def seen(o: Op) -> int | None:
        if o.kind == "read":
            return o.upper
        return {"ok": o.upper, "mismatch": o.actual}.get(o.outcome)

    return any(
        o.shard == op.shard and o.complete_ns is not None and o.complete_ns < op.invoke_ns
        and (seen(o) or 0) > op.lower
        for o in ops
    )  # fmt: skip


def _ok_as_mismatch(ops: list[Op]) -> list[Op]:
    """Oks recorded as mismatches seeing their own upper, when no info append
    from the same lower could have moved the upper there."""
    return [
        msgspec.structs.replace(a, outcome="mismatch", actual=a.upper)
        for a in ops
        if a.kind == "append" and a.outcome == "ok"
        and not any(i.outcome == "info" and i.lower == a.lower for i in _appends(ops, a.shard))
    ]  # fmt: skip


#: Each corruption's targets, all detectable; whether the witness must name the op.
CORRUPTIONS: dict[str, tuple[Callable[[list[Op]], list[Op]], bool]] = {
    "stale read": (_stale_read, True),
    "future read": (_future_read, True),
    "wrong actual": (_wrong_actual, True),
    "lost update": (_lost_update, True),
    "already never applied": (_already_never_applied, True),
    "ok as mismatch": (_ok_as_mismatch, False),
}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=_SHAPES,
    kind=st.sampled_from(sorted(CORRUPTIONS)),
    pick=st.integers(0, 2**16),
)
def test_one_detectable_corruption_makes_a_simulated_history_invalid(
    seed: int, shape: Shape, kind: str, pick: int
) -> None:
    ops = simulate(seed, shape)
    corrupt, named = CORRUPTIONS[kind]
    targets = corrupt(ops)
    assume(targets)
    bad = targets[pick % len(targets)]
    corrupted = [bad if op.id == bad.id else op for op in ops]
    start, culprits = _witness(corrupted)
    if named:
        assert _line(bad, corrupted) in start + culprits


def _brute_force(ops: list[Op]) -> bool:
    """Linearizable, by trying every order of the ops that must have happened
    with every subset of those that may have (a handful of ops only)."""
    kept = [op for op in ops if op.outcome != "fail" and (op.kind, op.outcome) != ("read", "info")]
    required = [op for op in kept if op.outcome != "info"]
    optional = [op for op in kept if op.outcome == "info"]
    model = ShardModel()
    subsets = itertools.chain.from_iterable(
        itertools.combinations(optional, k) for k in range(len(optional) + 1)
    )
    for subset in subsets:
        for order in itertools.permutations([*required, *subset]):
            if any(b.outcome != "info" and b.complete_ns < a.invoke_ns
                   for x, a in enumerate(order) for b in order[x + 1:]):  # fmt: skip
                continue  # b completed before a began, so b comes first
            state = model.initial()
            for op in order:
                state = model.step(state, op)
                if state is None:
                    break
            else:
                return True
    return False


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=_SHAPES,
    mutation=st.tuples(st.integers(0, 6), st.sampled_from(["upper", "actual", "outcome"])),
)
def test_the_search_agrees_with_trying_every_order(seed, shape, mutation) -> None:
    """On histories of at most 7 ops, valid or with one field changed."""
    ops = simulate(seed, shape._replace(shards=1))[:7]
    at, field = mutation
    if at < len(ops) and getattr(ops[at], field) is not None:
        value = getattr(ops[at], field)
        changed = {"ok": "mismatch", "mismatch": "already", "already": "ok", "info": "ok"}
        try:
            new = changed.get(value, value) if field == "outcome" else value + 1000
            ops[at] = msgspec.structs.replace(ops[at], **{field: new})
        except ValueError:
            pass  # not an op any more: keep it as it was
    assert check(ops).valid == _brute_force(ops)


#: A 300 s chaos run's history, for the module docstring's figure: 4 racing
#: coordinators (about one append committed a second) and 4 readers, one
#: read every 50 ms each, on one shard; 2% of calls lose their reply.
RUN_300S = Shape(
    writers=4, readers=4, duration_ms=300_000.0, append_gap_ms=1_300.0, read_gap_ms=50.0,
    latency_ms=1.0, info_p=0.02, fail_p=0.01, abandon_p=0.1,
)  # fmt: skip

#: The same at the pace of a real chaos run (about 50 appends a second,
#: docs/chaos.md), 5 ms calls, 5% of replies lost.
BUSY_300S = RUN_300S._replace(append_gap_ms=20.0, latency_ms=5.0, info_p=0.05)


def _bench() -> None:
    """Check each run's history, then again with its last read made stale
    (the upper before the last append), and print how long each took."""
    for shape in (RUN_300S, BUSY_300S):
        ops = simulate(0, shape)
        appends = [op for op in ops if op.kind == "append" and op.outcome == "ok"]
        last = max((op for op in ops if op.kind == "read" and op.outcome == "ok"), key=_invoked)
        moved = [a.lower for a in appends if a.complete_ns < last.invoke_ns]
        stale = msgspec.structs.replace(last, upper=max(moved))
        print(f"{len(ops):,} ops, {len(appends):,} appends committed")
        corrupted = [stale if op.id == last.id else op for op in ops]
        for name, history in (("valid", ops), ("one stale read", corrupted)):
            started = time.perf_counter()
            result = check(history)
            print(f"{name}: checked in {time.perf_counter() - started:.2f} s")
            print("\n".join(result.lines()))


def _invoked(op: Op) -> int:
    return op.invoke_ns


if __name__ == "__main__":
    _bench()
