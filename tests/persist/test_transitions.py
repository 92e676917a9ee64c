"""The pure state transitions, command by command, without any I/O."""

from __future__ import annotations

import msgspec
import pytest

from shardsink.persist.commands import (
    COMMAND_DECODER,
    RESULT_DECODER,
    AddRollup,
    AdvanceSince,
    AlreadyAppended,
    Appended,
    ApplyCompaction,
    CompareAndAppend,
    Done,
    ExpireReader,
    ExpireReaders,
    ExpireWriter,
    ExpireWriters,
    ForgetRetired,
    ForgetRollups,
    HeartbeatReader,
    HeartbeatWriter,
    InlineCapExceeded,
    Leased,
    LeaseSeqno,
    PartsMissing,
    ReaderExpired,
    Registered,
    RegisterReader,
    RegisterWriter,
    Rejected,
    Retain,
    WriterGone,
    WrongUpper,
)
from shardsink.persist.digest import Digest
from shardsink.persist.state import Batch, WriterState, check_shard_name
from shardsink.persist.transitions import _HANDLERS, retention_since
from tests.helpers.persist import W1, apply, blob_batch, inline_batch, s0


def with_digest(batch: Batch, digest: Digest | None) -> Batch:
    return msgspec.structs.replace(batch, digest=digest)


def caa(batches, lo, hi, token="t1", writer=W1):
    return CompareAndAppend(writer, token, tuple(batches), lo, hi)


def s1(**limits):
    """:func:`s0` with writer ``w`` registered, as ``W1`` (version 1)."""
    state, res = run(s0(**limits), RegisterWriter("w"))
    assert res == Registered(W1, 1)
    return state


def run(state, *commands, now=0):
    """Apply ``commands`` in order; returns the final state and the last result."""
    result = None
    for cmd in commands:
        new, result = apply(state, cmd, now)
        state = new or state
    return state, result


def test_every_command_has_a_handler():
    union = msgspec.inspect.type_info(COMMAND_DECODER.type)
    assert {t.cls for t in union.types} == set(_HANDLERS)


def test_not_a_command_is_a_type_error():
    with pytest.raises(TypeError, match="not a shard command"):
        apply(s0(), Done(1), 0)


def test_apply_never_mutates_its_input():
    state = s1()
    before = msgspec.msgpack.encode(state)
    assert isinstance(apply(state, caa([blob_batch("a", 0, 1)], 0, 1), 5)[1], Appended)
    apply(state, RegisterReader("r", 10), 5)
    apply(state, RegisterWriter("x"), 5)
    apply(state, ExpireWriter(W1), 5)
    assert msgspec.msgpack.encode(state) == before


class TestCompareAndAppend:
    def test_appends_and_advances(self):
        new, res = apply(s1(), caa([blob_batch("a", 0, 2)], 0, 2), 7)
        assert res == Appended(seqno=2, upper=2)
        assert new.seqno == 2 and new.upper == 2 and set(new.batches) == {"a"}
        assert new.writers[W1].token == "t1" and new.writers[W1].upper == 2
        assert new.writers[W1].heartbeat_ms == 7

    def test_wrong_upper_changes_nothing(self):
        state, _ = run(s1(), caa([], 0, 3))
        new, res = apply(state, caa([blob_batch("b", 1, 2)], 1, 2, token="t2"), 0)
        assert new is None and res == WrongUpper(expected=1, actual=3)

    def test_empty_interval_only_advances_upper(self):
        empty = Batch(id="e", lower=0, upper=5, parts=(), rows=0)
        new, res = apply(s1(), caa([empty], 0, 5), 0)
        assert res == Appended(2, 5) and new.batches == {} and new.upper == 5

    def test_several_batches_of_one_interval_commit_together_as_one(self):
        a, b = blob_batch("a", 0, 1), inline_batch("b", 0, 1)
        empty = Batch(id="e", lower=0, upper=1, parts=(), rows=0)
        new, _ = apply(s1(), caa([a, b, empty], 0, 1), 0)
        assert new.seqno == 2 and list(new.batches) == ["a"]
        assert new.batches["a"].parts == a.parts + b.parts and new.batches["a"].rows == 2
        assert new.inline_bytes == b.inline_bytes

    def test_same_token_is_already_appended_even_after_others_appended(self):
        state, other = s1(), "other.2"
        state, res = run(state, RegisterWriter("other"))
        assert res == Registered(other, 2)
        state, _ = run(state, caa([blob_batch("a", 0, 1)], 0, 1, token="x"))
        other_batch = blob_batch("b", 1, 2, writer=other)
        state, _ = run(state, caa([other_batch], 1, 2, token="y", writer=other))
        assert state.upper == 2
        new, res = apply(state, caa([blob_batch("a", 0, 1)], 0, 1, token="x"), 0)
        assert new is None and res == AlreadyAppended(upper=1)

    def test_a_writer_not_registered_is_gone(self):
        """Never registered, or expired: nothing is appended, whatever the
        append carries (an expired writer has no token left to match either)."""
        batch = blob_batch("a", 0, 1)
        assert apply(s0(), caa([batch], 0, 1), 0) == (None, WriterGone(W1))
        assert apply(s1(), caa([batch], 0, 1, writer="w"), 0) == (None, WriterGone("w"))
        state, _ = run(s1(), caa([batch], 0, 1, token="x"), ExpireWriter(W1))
        assert state.writers == {} and state.upper == 1
        # its retry: gone, not AlreadyAppended (and not WrongUpper)
        assert apply(state, caa([batch], 0, 1, token="x"), 0) == (None, WriterGone(W1))
        assert apply(state, caa([blob_batch("b", 1, 2)], 1, 2), 0) == (None, WriterGone(W1))

    @pytest.mark.parametrize(
        "key",
        [
            "s/part/a",  # no writer's (a part of a version before writer prefixes)
            "s/part/other.2/a",  # another writer's
            "s/part/w.10/a",  # a writer whose id starts with this one's
            "s/part/w.1",  # the prefix without its slash
            "t/part/w.1/a",  # this writer's prefix in another shard
        ],
    )
    def test_a_part_outside_the_writers_prefix_is_rejected(self, key):
        batch = blob_batch("a", 0, 1, key=key)
        new, res = apply(s1(), caa([inline_batch("i", 0, 1), batch], 0, 1), 0)
        assert new is None and isinstance(res, Rejected)
        assert repr(key) in res.reason and "'s/part/w.1/'" in res.reason

    @pytest.mark.parametrize(
        ("batches", "lo", "hi", "match"),
        [
            ([], 3, 3, "greater than"),
            ([blob_batch("a", 0, 2)], 0, 1, "not the appended interval"),
            ([blob_batch("a", 0, 1), blob_batch("a", 0, 1)], 0, 1, "appears twice"),
        ],
    )
    def test_malformed_is_rejected(self, batches, lo, hi, match):
        new, res = apply(s1(), caa(batches, lo, hi), 0)
        assert new is None and isinstance(res, Rejected) and match in res.reason

    def test_empty_token_is_rejected(self):
        _, res = apply(s1(), caa([], 0, 1, token=""), 0)
        assert isinstance(res, Rejected) and "token" in res.reason

    def test_batch_id_already_in_shard_is_rejected(self):
        state, _ = run(s1(), caa([blob_batch("a", 0, 1)], 0, 1))
        _, res = apply(state, caa([blob_batch("a", 1, 2)], 1, 2, token="t2"), 0)
        assert isinstance(res, Rejected) and "already in use" in res.reason

    def test_inline_bytes_are_tracked_and_capped(self):
        state, res = run(s1(), caa([inline_batch("a", 0, 1, 90)], 0, 1))
        assert isinstance(res, Appended) and state.inline_bytes == 90
        state, res = run(state, caa([inline_batch("b", 1, 2, 90)], 1, 2, token="t2"))
        assert state.inline_bytes == 180
        new, res = apply(state, caa([inline_batch("c", 2, 3, 90)], 2, 3, token="t3"), 0)
        assert new is None and res == InlineCapExceeded(inline_bytes=180, adding=90, cap=250)

    def test_inline_part_at_the_per_part_limit_is_rejected(self):
        _, res = apply(s1(), caa([inline_batch("a", 0, 1, 100)], 0, 1), 0)
        assert isinstance(res, Rejected) and "inline_max_bytes" in res.reason


class TestWriters:
    def test_register_and_expire(self):
        state, res = run(s0(), caa([], 0, 1, writer="x.0"), now=3)  # not registered: nothing
        assert res == WriterGone("x.0") and state.seqno == 0
        state, res = run(state, RegisterWriter("w"), now=3)
        assert res == Registered(W1, 1) and set(state.writers) == {W1}
        assert state.writers[W1].token == "" and state.writers[W1].heartbeat_ms == 3
        # registering it again (a retry) answers the same id, no new version
        assert apply(state, RegisterWriter("w"), 9) == (None, Registered(W1, 1))
        state, res = run(state, ExpireWriter(W1))
        assert res == Done(2) and state.writers == {}
        assert apply(state, ExpireWriter(W1), 0) == (None, Done(2))

    def test_ids_are_never_reused(self):
        """An id is its name and the seqno of the version registering it: a
        name that registers again once expired gets a new id, so nothing
        ever commits under an expired writer's prefix again."""
        state, _ = run(s0(), RegisterWriter("w"), caa([], 0, 4), ExpireWriter(W1))
        state, res = run(state, RegisterWriter("w"))
        assert res == Registered("w.4", 4) and set(state.writers) == {"w.4"}
        assert state.writers["w.4"].upper == 4  # it starts at the shard's upper
        # the new id may not commit the old id's parts
        new, res = apply(state, caa([blob_batch("a", 4, 5)], 4, 5, writer="w.4"), 0)
        assert new is None and isinstance(res, Rejected) and "'s/part/w.4/'" in res.reason
        new, res = apply(state, caa([blob_batch("a", 4, 5, writer="w.4")], 4, 5, "t", "w.4"), 0)
        assert isinstance(res, Appended) and new.batches["a"].parts[0].key == "s/part/w.4/a"

    def test_names_are_told_apart_by_their_last_dot(self):
        state, res = run(s0(), RegisterWriter("w"), RegisterWriter("w.1"))
        assert res == Registered("w.1.2", 2) and set(state.writers) == {W1, "w.1.2"}
        assert apply(state, RegisterWriter("w"), 0) == (None, Registered(W1, 2))
        assert apply(state, RegisterWriter("w.1"), 0) == (None, Registered("w.1.2", 2))
        state, res = run(state, RegisterWriter("a.b-c_d=e"))
        assert res == Registered("a.b-c_d=e.3", 3)

    @pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a b", "a~1", "é", "x" * 201])
    def test_a_name_that_is_not_one_key_segment_is_rejected(self, name):
        new, res = apply(s0(), RegisterWriter(name), 0)
        assert new is None and isinstance(res, Rejected) and repr(name) in res.reason


class TestReaders:
    def test_register_holds_the_new_version(self):
        new, res = apply(s0(), RegisterReader("r", 1000), 5)
        assert isinstance(res, Leased) and res.state == new
        assert new.readers["r"].seqno_hold == new.seqno == 1

    def test_lease_moves_hold_to_the_returned_version(self):
        state, _ = run(s1(), RegisterReader("r", 1000), caa([], 0, 1))
        assert state.readers["r"].seqno_hold == 2 and state.seqno == 3
        new, res = apply(state, LeaseSeqno("r"), 9)
        assert res.state is new and new.readers["r"].seqno_hold == new.seqno == 4
        assert new.readers["r"].heartbeat_ms == 9

    def test_unknown_reader_is_expired(self):
        assert apply(s0(), LeaseSeqno("r"), 0) == (None, ReaderExpired("r"))
        assert apply(s0(), HeartbeatReader("r"), 0) == (None, ReaderExpired("r"))

    def test_heartbeat_keeps_hold(self):
        state, _ = run(s1(), RegisterReader("r", 1000), caa([], 0, 1))
        new, res = apply(state, HeartbeatReader("r"), 50)
        assert res == Done(4) and new.readers["r"].seqno_hold == 2
        assert new.readers["r"].heartbeat_ms == 50

    def test_expire_readers_drops_only_stale_leases(self):
        state, _ = run(s0(), RegisterReader("old", 100), RegisterReader("new", 100), now=0)
        state, _ = run(state, HeartbeatReader("new"), now=150)
        assert apply(state, ExpireReaders(), 100) == (None, Done(state.seqno))
        new, _ = apply(state, ExpireReaders(), 101)
        assert set(new.readers) == {"new"}

    def test_expire_reader(self):
        state, _ = run(s0(), RegisterReader("r", 100))
        new, _ = apply(state, ExpireReader("r"), 0)
        assert new.readers == {}
        assert apply(new, ExpireReader("r"), 0)[0] is None

    def test_zero_lease_is_rejected(self):
        assert isinstance(apply(s0(), RegisterReader("r", 0), 0)[1], Rejected)

    def test_seqno_hold_is_min_over_readers(self):
        state, _ = run(s0(), RegisterReader("a", 10), RegisterReader("b", 10), LeaseSeqno("a"))
        assert state.seqno_hold() == 2
        assert s0().seqno_hold() == 0


class TestSince:
    def test_advance_since(self):
        state, _ = run(s1(), caa([], 0, 10))
        assert state.upper == 10
        new, _ = apply(state, AdvanceSince(4), 0)
        assert new.since == 4
        assert apply(new, AdvanceSince(3), 0) == (None, Done(new.seqno))
        assert isinstance(apply(new, AdvanceSince(10), 0)[1], Rejected)


class TestCompaction:
    def three(self):
        """Three batches of ``W1``, and ``C``, a compaction's writer."""
        state, _ = run(
            s1(),
            caa([blob_batch("a", 0, 1)], 0, 1, token="1"),
            caa([blob_batch("b", 1, 2)], 1, 2, token="2"),
            caa([inline_batch("c", 2, 3)], 2, 3, token="3"),
            RegisterWriter("c"),
        )
        assert set(state.writers) == {W1, self.C} and state.upper == 3
        return state

    C = "c.5"

    def test_replaces_inputs_and_retires_their_blobs(self):
        state = self.three()
        out = inline_batch("ab", 0, 2, 30)
        new, res = apply(state, ApplyCompaction(("a", "b"), out, self.C), 0)
        assert res == Done(new.seqno)
        assert set(new.batches) == {"ab", "c"}
        assert new.retired == {new.seqno: ("s/part/w.1/a", "s/part/w.1/b")}
        assert new.inline_bytes == state.inline_bytes + 30

    def test_is_idempotent(self):
        state = self.three()
        cmd = ApplyCompaction(("a", "b"), blob_batch("ab", 0, 2, writer=self.C), self.C)
        new, _ = apply(state, cmd, 0)
        assert new.batches["ab"] == cmd.output
        assert apply(new, cmd, 0) == (None, Done(new.seqno))
        # a retry after its writer left (expired once it committed) changes nothing either
        gone, _ = run(new, ExpireWriter(self.C))
        assert apply(gone, cmd, 0) == (None, Done(gone.seqno))

    def test_a_writer_not_registered_is_gone(self):
        state = self.three()
        out = blob_batch("ab", 0, 2, writer="x.9")
        assert apply(state, ApplyCompaction(("a", "b"), out, "x.9"), 0) == (None, WriterGone("x.9"))
        state, _ = run(state, ExpireWriter(self.C))
        out = blob_batch("ab", 0, 2, writer=self.C)
        cmd = ApplyCompaction(("a", "b"), out, self.C)
        assert apply(state, cmd, 0) == (None, WriterGone(self.C))

    def test_an_output_part_outside_the_writers_prefix_is_rejected(self):
        state = self.three()
        for key in ("s/part/ab", "s/part/w.1/ab"):  # no writer's; another (live) writer's
            out = blob_batch("ab", 0, 2, key=key)
            new, res = apply(state, ApplyCompaction(("a", "b"), out, self.C), 0)
            assert new is None and isinstance(res, Rejected)
            assert repr(key) in res.reason and "'s/part/c.5/'" in res.reason

    @pytest.mark.parametrize(
        ("inputs", "out", "match"),
        [
            (("a", "x"), blob_batch("o", 0, 2, writer=C), "no longer in state"),
            (("a", "c"), blob_batch("o", 0, 3, writer=C), "not adjacent"),
            (("a", "b"), blob_batch("o", 0, 3, writer=C), "covers"),
            ((), blob_batch("o", 0, 3, writer=C), "one or more"),
        ],
    )
    def test_rejections(self, inputs, out, match):
        new, res = apply(self.three(), ApplyCompaction(inputs, out, self.C), 0)
        assert new is None and isinstance(res, Rejected) and match in res.reason

    def test_an_output_must_carry_the_sum_of_its_inputs_digests(self):
        """A compaction that drops its inputs' digests, or carries another
        content than theirs, is refused: verify could not tell rows it
        dropped from rows never written. Rows differ (consolidation) and are
        not compared; with an input without a digest, none is carried."""
        a, b = Digest(2, 2, 11, 1), Digest(3, 1, 5, 1)
        state, _ = run(
            s1(),
            caa([with_digest(blob_batch("a", 0, 1), a)], 0, 1, token="1"),
            caa([with_digest(blob_batch("b", 1, 2), b)], 1, 2, token="2"),
            caa([blob_batch("c", 2, 3)], 2, 3, token="3"),
            RegisterWriter("c"),
        )
        out = blob_batch("ab", 0, 2, writer=self.C)
        for carried in (None, a, Digest(5, 3, 17, 1), Digest(4, 3, 16, 2)):
            new, res = apply(
                state, ApplyCompaction(("a", "b"), with_digest(out, carried), self.C), 0
            )
            assert new is None and isinstance(res, Rejected) and "digest" in res.reason, carried
        new, res = apply(
            state, ApplyCompaction(("a", "b"), with_digest(out, Digest(4, 3, 16, 1)), self.C), 0
        )
        assert res == Done(new.seqno)
        bc = blob_batch("bc", 1, 3, writer=self.C)
        assert isinstance(
            apply(state, ApplyCompaction(("b", "c"), with_digest(bc, b), self.C), 0)[1], Rejected
        )
        new, res = apply(state, ApplyCompaction(("b", "c"), bc, self.C), 0)
        assert res == Done(new.seqno)

    def test_inline_output_respects_cap_net_of_freed_inputs(self):
        state = self.three()  # inline 40 of cap 250
        bc = ApplyCompaction(("b", "c"), inline_batch("bc", 1, 3, 99), self.C)
        ok, _ = apply(state, bc, 0)
        assert ok.inline_bytes == 99
        state, _ = run(state, caa([inline_batch("d", 3, 4, 99)], 3, 4, token="4"))
        state, _ = run(state, caa([inline_batch("e", 4, 5, 99)], 4, 5, token="5"))
        ab = ApplyCompaction(("a", "b"), inline_batch("ab", 0, 2, 99), self.C)
        _, res = apply(state, ab, 0)
        assert isinstance(res, InlineCapExceeded)


class TestRollupsAndRetired:
    def test_add_rollup(self):
        state, _ = run(s1(), caa([], 0, 1), caa([], 1, 2, token="t2"))
        assert state.seqno == 3
        new, _ = apply(state, AddRollup(3, "k3"), 0)
        assert new.latest_rollup().key == "k3" and set(new.rollups) == {0, 3}
        assert apply(new, AddRollup(2, "k2"), 0) == (None, Done(new.seqno))
        assert isinstance(apply(new, AddRollup(99, "k"), 0)[1], Rejected)

    def test_forget_rollups_retires_older_ones(self):
        state, _ = run(s1(), caa([], 0, 1), AddRollup(2, "k2"), caa([], 1, 2, token="t2"))
        state, _ = run(state, AddRollup(4, "k4"))
        new, _ = apply(state, ForgetRollups(4), 0)
        assert set(new.rollups) == {4}
        assert new.retired == {new.seqno: ("s/rollup/0-x", "k2")}
        assert isinstance(apply(new, ForgetRollups(3), 0)[1], Rejected)
        assert apply(new, ForgetRollups(4), 0)[0] is None

    def test_forget_retired(self):
        state, _ = run(s1(), caa([blob_batch("a", 0, 1)], 0, 1), caa([], 1, 2, token="2"))
        state, _ = run(state, ApplyCompaction(("a",), blob_batch("o", 0, 1), W1))
        assert set(state.batches) == {"o"}
        (seqno,) = state.retired
        new, _ = apply(state, ForgetRetired((seqno, 999)), 0)
        assert new.retired == {}
        assert apply(new, ForgetRetired((seqno,)), 0)[0] is None


class TestWriterExpiry:
    def test_heartbeat_renews_without_touching_token_or_upper(self):
        state, _ = run(s1(), caa([blob_batch("a", 0, 1)], 0, 1, token="x"), now=5)
        new, res = apply(state, HeartbeatWriter(W1), 90)
        assert res == Done(new.seqno) and new.writers[W1].heartbeat_ms == 90
        assert (new.writers[W1].token, new.writers[W1].upper) == ("x", 1)

    def test_an_expired_writer_stays_gone(self):
        """Its heartbeat no longer registers it again (its parts may have
        been swept meanwhile): heartbeat and appends answer WriterGone and
        change nothing; its name registers anew, under a new id."""
        state, _ = run(s1(), caa([blob_batch("a", 0, 4)], 0, 4, token="x"), now=0)
        state, _ = run(state, ExpireWriters(10), now=11)
        assert state.writers == {} and state.upper == 4
        assert apply(state, HeartbeatWriter(W1), 12) == (None, WriterGone(W1))
        append = caa([blob_batch("b", 4, 5)], 4, 5, token="y")
        assert apply(state, append, 12) == (None, WriterGone(W1))
        state, res = run(state, RegisterWriter("w"), now=12)
        assert res == Registered(f"w.{state.seqno}", state.seqno) and res.writer_id != W1
        assert state.writers[res.writer_id] == WriterState(token="", upper=4, heartbeat_ms=12)
        assert apply(state, HeartbeatWriter(W1), 13) == (None, WriterGone(W1))

    def test_expires_exactly_the_writers_past_their_lease(self):
        state, _ = run(s0(), RegisterWriter("old"), now=0)
        state, _ = run(state, RegisterWriter("beat"), RegisterWriter("appended"), now=0)
        assert set(state.writers) == {"old.1", "beat.2", "appended.3"}
        state, _ = run(state, HeartbeatWriter("beat.2"), caa([], 0, 1, writer="appended.3"), now=50)
        assert apply(state, ExpireWriters(100), 100)[0] is None  # 0 + 100 not yet passed
        new, res = apply(state, ExpireWriters(100), 101)
        assert res == Done(new.seqno) and set(new.writers) == {"beat.2", "appended.3"}
        assert set(run(new, ExpireWriters(100), now=151)[0].writers) == set()

    def test_lease_below_one_ms_is_rejected(self):
        new, res = apply(s0(), ExpireWriters(0), 0)
        assert new is None and isinstance(res, Rejected) and ">= 1 ms" in res.reason


class TestRetention:
    def test_since_trails_the_upper_by_retain(self):
        state, _ = run(s1(), caa([], 0, 100))
        assert state.upper == 100
        assert retention_since(state, 30, 0) == 70
        new, res = apply(state, Retain(30), 0)
        assert res == Done(new.seqno) and new.since == 70
        assert apply(new, Retain(30), 0)[0] is None  # already there: no new version
        assert apply(new, Retain(50), 0)[0] is None  # since never moves back

    def test_a_live_reader_holds_back_the_times_its_version_kept(self):
        state, _ = run(s1(), caa([], 0, 40), RegisterReader("r", 100), now=0)
        assert state.readers["r"].upper_hold == 40
        state, _ = run(state, caa([], 40, 100, token="2"), now=0)
        assert retention_since(state, 30, 50) == 10  # r's version kept [10, 40)
        assert retention_since(state, 30, 101) == 70  # r's lease ran out
        state, _ = run(state, LeaseSeqno("r"), now=60)
        assert state.readers["r"].upper_hold == 100
        assert run(state, Retain(30), now=60)[0].since == 70

    def test_since_stays_below_the_upper(self):
        state, _ = run(s1(), caa([], 0, 5))
        assert state.upper == 5
        assert retention_since(state, 1, 0) == 4
        assert retention_since(s0(), 10, 0) == 0

    def test_retain_below_one_is_rejected(self):
        new, res = apply(s0(), Retain(0), 0)
        assert new is None and isinstance(res, Rejected) and ">= 1" in res.reason


def test_commands_and_results_round_trip_as_msgpack():
    state, _ = run(s1(), caa([inline_batch("a", 0, 1)], 0, 1))
    assert state.upper == 1
    cmds = [caa([blob_batch("b", 1, 2)], 1, 2), ExpireReaders(), AddRollup(1, "k")]
    cmds += [HeartbeatWriter(W1), ExpireWriters(5), Retain(7), RegisterWriter("w")]
    cmds += [ApplyCompaction(("a",), blob_batch("c", 0, 1), W1)]
    for cmd in cmds:
        assert COMMAND_DECODER.decode(msgspec.msgpack.encode(cmd)) == cmd
    results = [Leased(state), WrongUpper(1, 2), InlineCapExceeded(1, 2, 3)]
    results += [Registered(W1, 1), WriterGone(W1), PartsMissing(("s/part/w.1/a",), "gone")]
    for res in results:
        assert RESULT_DECODER.decode(msgspec.msgpack.encode(res)) == res


def test_malformed_command_bytes_are_a_decode_error():
    with pytest.raises(msgspec.ValidationError):
        COMMAND_DECODER.decode(msgspec.msgpack.encode({"type": "compare_and_append", "x": 1}))


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "a b", "x" * 201])
def test_bad_shard_names(name):
    with pytest.raises(ValueError, match="invalid shard name"):
        check_shard_name(name)
