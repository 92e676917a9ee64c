"""The pure shared-batch state machine: who receives a shared batch.

Ports of the reference thread's cases (a handle dropped without finishing, an
abandoned shared batch, two handles racing ``finish`` 5,000 times with sweeps
in between) and properties over random interleavings: every generation with
rows is received by exactly one finisher, and the batch it receives lists
every handle's rows.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from shardsink.builder.shared_batch import (
    ConflictingDescription,
    Deferred,
    Description,
    Last,
    NotLast,
    Orphaned,
    ProtocolError,
    Resolved,
    SharedBatches,
)

BEST_EFFORT = Description(0, 1000, barrier=False)
BARRIER = Description(0, 1000, barrier=True)
BID = (0, 0)


def test_last_finisher_receives_every_handles_rows():
    m = SharedBatches(3)
    for w in range(3):
        assert m.join(BID, BEST_EFFORT, w) == 0
        m.push(BID, w, 10 + w)
    assert m.finish(BID, 1) == NotLast(0)
    assert m.finish(BID, 0) == NotLast(0)
    assert m.finish(BID, 2) == Last(0, {0: 10, 1: 11, 2: 12})


def test_a_handle_that_pushed_nothing_can_be_last():
    m = SharedBatches(2)
    m.join(BID, BEST_EFFORT, 0)
    m.push(BID, 0, 5)
    m.join(BID, BEST_EFFORT, 1)
    assert m.finish(BID, 0) == NotLast(0)
    assert m.finish(BID, 1) == Last(0, {0: 5})


def test_best_effort_join_after_the_handoff_starts_the_next_generation():
    m = SharedBatches(2)
    m.join(BID, BEST_EFFORT, 0)
    m.push(BID, 0, 1)
    assert m.finish(BID, 0) == Last(0, {0: 1})
    assert m.join(BID, BEST_EFFORT, 1) == 1
    m.push(BID, 1, 2)
    assert m.finish(BID, 1) == Last(1, {1: 2})


def test_barrier_waits_for_every_worker_data_or_nothing():
    m = SharedBatches(3)
    m.join(BID, BARRIER, 0)
    m.push(BID, 0, 4)
    assert m.finish(BID, 0) == NotLast(0)
    m.join(BID, BARRIER, 2)  # nothing this interval
    assert m.finish(BID, 2) == NotLast(0)
    m.join(BID, BARRIER, 1)
    m.push(BID, 1, 6)
    assert m.finish(BID, 1) == Last(0, {0: 4, 1: 6})
    with pytest.raises(ProtocolError, match="already finished"):
        m.join(BID, BARRIER, 1)


def test_idle_barrier_interval_is_received_with_no_contributors():
    m = SharedBatches(2)
    for w in range(2):
        m.join(BID, BARRIER, w)
    assert m.finish(BID, 0) == NotLast(0)
    assert m.finish(BID, 1) == Last(0, {})


def test_two_descriptions_for_one_batch_id_are_an_error():
    m = SharedBatches(2)
    m.join(BID, BEST_EFFORT, 0)
    with pytest.raises(ConflictingDescription, match=r"batch id \(0, 0\) is described as"):
        m.join(BID, Description(0, 2000, barrier=False), 1)
    with pytest.raises(ConflictingDescription):
        m.join(BID, BARRIER, 1)


def test_protocol_errors():
    m = SharedBatches(2)
    with pytest.raises(ProtocolError, match="no open handle"):
        m.push(BID, 0, 1)
    with pytest.raises(ProtocolError, match="no open handle"):
        m.finish(BID, 0)
    with pytest.raises(ProtocolError, match=r"worker 2 is not one of \[0, 1\]"):
        m.join(BID, BEST_EFFORT, 2)
    m.join(BID, BEST_EFFORT, 0)
    with pytest.raises(ProtocolError, match="pushed -1 rows"):
        m.push(BID, 0, -1)


def test_a_host_builders_workers_are_its_hosts_groups():
    """A host builder's senders are the groups of its host, numbered as they
    are: a barrier waits for exactly those, and no other group may join."""
    m = SharedBatches((1, 4))
    with pytest.raises(ProtocolError, match=r"worker 0 is not one of \[1, 4\]"):
        m.join(BID, BARRIER, 0)
    for g in (1, 4):
        m.join(BID, BARRIER, g)
        m.push(BID, g, 2)
    assert isinstance(m.finish(BID, 1), NotLast)  # a barrier's last is the last to finish
    last = m.finish(BID, 4)
    assert isinstance(last, Last) and last.contributors == {1: 2, 4: 2}
    with pytest.raises(ValueError, match="at least one worker"):
        SharedBatches(())


def test_handle_dropped_without_finishing():
    """Reference ``test_shared_batch_dropped_handle``: dropping the last open
    handle hands the batch to nobody, once; a non-last dropout's rows stay."""
    m = SharedBatches(3)
    for w in range(3):
        m.join(BID, BEST_EFFORT, w)
        m.push(BID, w, 1)
    assert m.drop(BID, 0) is None  # others still hold it
    assert m.finish(BID, 1) == NotLast(0)
    assert m.drop(BID, 2) == Orphaned(BID, 0)  # the last handle: nobody receives it
    assert m.abandon(BID) == []  # already reported orphaned, never twice
    # a dropped non-last handle's rows still reach the last finisher
    m2 = SharedBatches(2)
    for w in range(2):
        m2.join(BID, BEST_EFFORT, w)
        m2.push(BID, w, 3)
    assert m2.drop(BID, 0) is None
    assert m2.finish(BID, 1) == Last(0, {0: 3, 1: 3})


def test_barrier_that_loses_a_member_is_orphaned():
    m = SharedBatches(3)
    for w in range(3):
        m.join(BID, BARRIER, w)
    assert m.finish(BID, 0) == NotLast(0)
    assert m.drop(BID, 1) == Orphaned(BID, 0)
    assert m.finish(BID, 2) == NotLast(0)  # nobody can receive it any more


def test_abandoned_shared_batch():
    """Reference ``test_shared_batch_abandoned``: an abandoned id's open
    generations are reported once and nobody receives them."""
    m = SharedBatches(2)
    m.join(BID, BEST_EFFORT, 0)
    m.push(BID, 0, 1)
    assert m.finish(BID, 0) == Last(0, {0: 1})
    m.join(BID, BEST_EFFORT, 1)
    m.push(BID, 1, 1)
    assert m.abandon(BID) == [Orphaned(BID, 1)]  # generation 0 was handed off already
    assert BID not in m
    with pytest.raises(ProtocolError):
        m.finish(BID, 1)
    assert m.abandon(BID) == []


def test_sweep_forgets_done_ids_and_never_a_live_one():
    """The reference bug: a cleanup sweep made every finisher believe it was
    not last. Here a sweep, whatever it is asked, leaves an id in progress
    exactly as it was; only completely done ids are forgotten."""
    m = SharedBatches(2)
    done, live = (0, 0), (1, 0)
    m.join(done, BEST_EFFORT, 0)
    assert isinstance(m.finish(done, 0), Last)
    m.join(live, Description(1000, 2000, False), 0)
    m.push(live, 0, 7)
    m.join(live, Description(1000, 2000, False), 1)
    assert m.finish(live, 0) == NotLast(0)
    assert m.sweep(lambda bid: False) == [done]
    assert m.ids == [live]
    assert m.finish(live, 1) == Last(0, {0: 7})
    barrier = SharedBatches(2)
    barrier.join(done, BARRIER, 0)
    assert barrier.finish(done, 0) == NotLast(0)  # no open handle, but not done
    assert barrier.sweep(lambda bid: False) == []
    barrier.join(done, BARRIER, 1)
    assert barrier.finish(done, 1) == Last(0, {})


def test_a_worker_that_joins_during_the_linger_is_last():
    m = SharedBatches(3, linger_s=0.005)
    m.join(BID, BEST_EFFORT, 0)
    m.push(BID, 0, 4)
    assert m.finish(BID, 0, now=1.0) == Deferred(0)
    assert m.next_deadline() == pytest.approx(1.005)
    m.expire(1.004)
    assert m.take_resolved() == []
    assert m.join(BID, BEST_EFFORT, 1) == 0  # the same generation, not a second batch
    m.push(BID, 1, 5)
    assert m.finish(BID, 1, now=1.0045) == Deferred(0)  # 2 of 3 joined: it lingers on
    assert m.take_resolved() == [Resolved(BID, 0, NotLast(0))]
    m.expire(1.005)  # the deadline of the first deferral holds: lingers add up to linger_s
    assert m.take_resolved() == [Resolved(BID, 1, Last(0, {0: 4, 1: 5}))]
    assert m.next_deadline() is None


def test_the_last_worker_to_join_ends_the_linger_at_once():
    m = SharedBatches(2, linger_s=0.005)
    m.join(BID, BEST_EFFORT, 0)
    m.push(BID, 0, 1)
    assert m.finish(BID, 0, now=1.0) == Deferred(0)
    m.join(BID, BEST_EFFORT, 1)
    m.push(BID, 1, 2)
    assert m.finish(BID, 1, now=1.001) == Last(0, {0: 1, 1: 2})  # every worker joined
    assert m.take_resolved() == [Resolved(BID, 0, NotLast(0))]
    assert m.next_deadline() is None


def test_the_deferred_finisher_is_last_when_the_linger_expires():
    m = SharedBatches(3, linger_s=0.005)
    m.join(BID, BEST_EFFORT, 0)
    m.push(BID, 0, 3)
    assert m.finish(BID, 0, now=1.0) == Deferred(0)
    m.expire(1.005)
    assert m.take_resolved() == [Resolved(BID, 0, Last(0, {0: 3}))]
    assert m.join(BID, BEST_EFFORT, 1) == 1  # handed off: a late worker starts the next one
    m.push(BID, 1, 1)
    assert m.finish(BID, 1, now=2.0) == Deferred(1)  # 2 of 3 joined the id
    m.expire(2.005)
    assert m.take_resolved() == [Resolved(BID, 1, Last(1, {1: 1}))]


def test_an_expired_linger_with_a_joiner_still_open_leaves_it_to_the_joiner():
    m = SharedBatches(3, linger_s=0.005)
    m.join(BID, BEST_EFFORT, 0)
    assert m.finish(BID, 0, now=1.0) == Deferred(0)
    m.join(BID, BEST_EFFORT, 1)
    m.push(BID, 1, 2)
    m.expire(1.01)
    assert m.take_resolved() == [Resolved(BID, 0, NotLast(0))]
    assert m.finish(BID, 1, now=1.02) == Last(0, {1: 2})  # past the deadline: no new linger


def test_a_finish_after_the_deadline_does_not_linger():
    m = SharedBatches(3, linger_s=0.005)
    m.join(BID, BEST_EFFORT, 0)
    assert m.finish(BID, 0, now=1.0) == Deferred(0)
    m.join(BID, BEST_EFFORT, 1)
    # the builder has not expired the linger yet when the joiner finishes
    assert m.finish(BID, 1, now=1.006) == Last(0, {})
    assert m.take_resolved() == [Resolved(BID, 0, NotLast(0))]


def test_dropping_the_last_open_handle_during_the_linger_hands_off_to_the_deferred():
    m = SharedBatches(3, linger_s=0.005)
    m.join(BID, BEST_EFFORT, 0)
    m.push(BID, 0, 1)
    assert m.finish(BID, 0, now=1.0) == Deferred(0)
    m.join(BID, BEST_EFFORT, 1)
    m.push(BID, 1, 2)
    assert m.drop(BID, 1) is None  # somebody still receives the generation
    assert m.take_resolved() == [Resolved(BID, 0, Last(0, {0: 1, 1: 2}))]
    assert m.abandon(BID) == []
    assert m.next_deadline() is None


def test_abandon_during_the_linger_answers_the_deferred_and_orphans_the_generation():
    m = SharedBatches(3, linger_s=0.005)
    m.join(BID, BEST_EFFORT, 0)
    m.push(BID, 0, 1)
    assert m.finish(BID, 0, now=1.0) == Deferred(0)
    assert m.sweep(lambda bid: False) == []  # a lingering generation is in progress
    assert m.abandon(BID) == [Orphaned(BID, 0)]
    assert m.take_resolved() == [Resolved(BID, 0, NotLast(0))]
    m.expire(2.0)
    assert m.take_resolved() == []
    assert m.next_deadline() is None


def test_barrier_and_a_zero_linger_never_defer():
    m = SharedBatches(3)
    m.join(BID, BEST_EFFORT, 0)
    assert m.finish(BID, 0, now=1.0) == Last(0, {})
    b = SharedBatches(2, linger_s=1.0)
    b.join(BID, BARRIER, 0)
    assert b.finish(BID, 0, now=1.0) == NotLast(0)
    b.join(BID, BARRIER, 1)
    assert b.finish(BID, 1, now=1.0) == Last(0, {})
    assert b.next_deadline() is None


@pytest.mark.parametrize("both_push", [True, False], ids=["both-pushed", "one-pushed"])
def test_two_handles_race_finish_5000_times(both_push):
    """Two handles on one id finish in every order, with sweeps of other ids
    in between (the reference bug: a sweep made every finisher believe it was
    not last). Exactly one receives the batch, and it holds every handle's rows."""
    rng = random.Random(5000)
    m = SharedBatches(2)
    for i in range(5000):
        bid = (i, 0)
        desc = Description(i * 10, i * 10 + 10, barrier=False)
        steps = [("join", 0), ("join", 1)]
        rng.shuffle(steps)
        for _, w in steps:
            m.join(bid, desc, w)
        m.push(bid, 0, 1)
        if both_push:
            m.push(bid, 1, 1)
        order = [0, 1]
        rng.shuffle(order)
        decisions = []
        for w in order:
            if rng.random() < 0.5:
                m.sweep(lambda b: False)
            decisions.append(m.finish(bid, w))
        received = [d for d in decisions if isinstance(d, Last)]
        assert len(received) == 1, decisions
        assert received[0].contributors == ({0: 1, 1: 1} if both_push else {0: 1})


_OPS = st.lists(
    st.tuples(st.sampled_from(["step", "sweep", "drop", "tick"]), st.integers(0, 5)), max_size=80
)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 5),
    barrier=st.booleans(),
    linger=st.sampled_from([0.0, 2.0]),
    rows=st.lists(st.integers(0, 3), min_size=5, max_size=5),
    ops=_OPS,
)
def test_every_generation_is_received_once_or_orphaned_once(n, barrier, linger, rows, ops):
    """Random interleavings of join/push/finish/drop, sweeps and a clock that
    ends lingers: each generation ends exactly once (one Last, or one Orphaned
    after a drop), a Last lists exactly the rows pushed into it, every finish
    is answered exactly once, and a sweep forgets the id only once everything
    that joined it has ended."""
    m = SharedBatches(n, linger_s=linger)
    now = 0.0
    bid = (7, 0)
    desc = Description(0, 10, barrier)
    # worker -> next step: 0 join, 1 push, 2 finish, 3 done
    state = dict.fromkeys(range(n), 0)
    gen_of: dict[int, int] = {}
    pushed: dict[int, dict[int, int]] = {}
    ends: dict[int, list] = {}
    dropped: set[int] = set()
    deferred: set[int] = set()

    def decided(decision) -> None:
        if isinstance(decision, Last):
            ends.setdefault(decision.generation, []).append(decision)

    def collect() -> None:
        for r in m.take_resolved():
            assert r.worker in deferred, (r, deferred)
            deferred.discard(r.worker)
            decided(r.decision)

    def finish(w: int) -> None:
        decision = m.finish(bid, w, now)
        if isinstance(decision, Deferred):
            deferred.add(w)
        decided(decision)
        collect()

    def advance(w: int) -> None:
        """Worker ``w``'s next step: join, push, finish."""
        if state[w] == 0:
            gen_of[w] = m.join(bid, desc, w)
        elif state[w] == 1:
            m.push(bid, w, rows[w])
            if rows[w]:
                pushed.setdefault(gen_of[w], {})[w] = rows[w]
        else:
            finish(w)
        state[w] += 1

    m.join((1, 0), desc, 0)  # another id, for the sweeps to remove
    for op, arg in ops:
        w = arg % n
        if op == "tick":
            now += arg
            m.expire(now)
            collect()
        elif op == "sweep":
            if bid in m.sweep(lambda b: False):
                # only a done id is forgotten; later joins of it would be stale
                assert all(state[v] in (0, 3) for v in range(n)), state
                assert all(ends.get(g) for g in set(gen_of.values())), ends
                state = {v: 3 for v in range(n)}
        elif op == "drop" and state[w] in (1, 2):
            result = m.drop(bid, w)
            state[w] = 3
            dropped.add(gen_of[w])
            if result is not None:
                ends.setdefault(result.generation, []).append(result)
            collect()
        elif state[w] < 3:
            advance(w)
    # let everyone still in flight finish
    for w in range(n):
        while state[w] < 3:
            advance(w)
    m.expire(now + linger)
    collect()
    assert not deferred and m.next_deadline() is None
    for gen in set(gen_of.values()):
        outcome = ends.get(gen, [])
        assert len(outcome) == 1, (gen, outcome)
        if isinstance(outcome[0], Last):
            assert outcome[0].contributors == pushed.get(gen, {})
        else:
            assert gen in dropped


def test_an_id_is_settled_once_every_worker_finished_whatever_the_generations():
    """``coalesce`` host finishes a group's host handle when its id settles:
    a late worker's second generation keeps it open, a deferred finish too."""
    m = SharedBatches(3, linger_s=0.01)
    assert not m.settled(BID)  # unknown
    for w in (0, 1):
        m.join(BID, BEST_EFFORT, w)
    assert m.finish(BID, 0, now=0.0) == NotLast(0)
    assert m.finish(BID, 1, now=0.0) == Deferred(0)  # worker 2 has not joined
    assert not m.settled(BID)
    m.expire(1.0)
    assert [r.decision for r in m.take_resolved()] == [Last(0, {})]
    assert not m.settled(BID)  # worker 2 still to come
    assert m.join(BID, BEST_EFFORT, 2) == 1
    assert not m.settled(BID)
    assert m.finish(BID, 2, now=1.0) == Last(1, {})
    assert m.settled(BID)
    b = (1, 0)
    for w in range(3):
        m.join(b, BARRIER, w)
    assert [m.finish(b, w) for w in range(3)][-1] == Last(0, {})
    assert m.settled(b)
