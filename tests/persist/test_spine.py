"""The spine's rule: after any sequence of appends and merges, rounds of
merges end within the batch bound, and every merge's output is exactly its
consolidated input."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings, strategies as st

from shardsink.persist import parts as P, spine
from shardsink.persist.batches import load_part
from shardsink.persist.shard import Shard
from shardsink.persist.state import Batch, InlinePart
from tests.helpers.persist import memory_stores, rows_of, s0, spine_pass, updates


def _merge_round(state, shrink: st.DataObject):
    """One round of the spine's merges on levels only: each output keeps the
    rows of its inputs less what consolidation cancelled (drawn)."""
    runs = spine.merges(state)
    order = state.ordered_batches()
    batches = dict(state.batches)
    for run in runs:
        start = order.index(run[0])
        assert run == order[start : start + len(run)]  # adjacent, in time order
        for batch in run:
            del batches[batch.id]
        rows = shrink.draw(st.integers(0, sum(b.rows for b in run)))
        out = Batch("m" + "".join(b.id for b in run), run[0].lower, run[-1].upper, (), rows)
        batches[out.id] = out
    ids = [b.id for run in runs for b in run]
    assert len(ids) == len(set(ids))  # a round's merges are disjoint
    return msgspec.structs.replace(state, batches=batches), bool(runs)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(1, 5000), st.none()), max_size=80), st.data())
def test_rounds_of_merges_end_within_the_bound(steps, data):
    """Appends of any sizes interleaved with merge rounds (``None``); then
    rounds until none merges: at most ``batch_bound`` batches, levels
    strictly decreasing in time order."""
    state = s0()
    for i, step in enumerate(steps):
        if step is None:
            state, _ = _merge_round(state, data)
            continue
        batch = Batch(f"a{i}", i, i + 1, (), step)
        state = msgspec.structs.replace(state, batches={**state.batches, batch.id: batch})
    for _ in range(len(state.batches) + 1):
        state, merged = _merge_round(state, data)
        if not merged:
            break
    else:
        raise AssertionError("merge rounds never ended")
    assert len(state.batches) <= spine.batch_bound(state)
    levels = [spine.level(b) for b in state.ordered_batches()]
    assert levels == sorted(set(levels), reverse=True)


def test_equal_appends_count_in_binary():
    state = s0()
    for i in range(37):
        batch = Batch(f"a{i}", i, i + 1, (), 3)
        state = msgspec.structs.replace(state, batches={**state.batches, batch.id: batch})
        state = _exact_round(state)
        assert not spine.merges(state)  # one round reaches the rule's fixed point
    # 37 = 0b100101 appends of 3 rows: batches of 32, 4 and 1 appends
    assert [b.rows for b in state.ordered_batches()] == [96, 12, 3]


def _exact_round(state):
    batches = dict(state.batches)
    for run in spine.merges(state):
        for batch in run:
            del batches[batch.id]
        rows = sum(b.rows for b in run)
        out = Batch("m" + "".join(b.id for b in run), run[0].lower, run[-1].upper, (), rows)
        batches[out.id] = out
    return msgspec.structs.replace(state, batches=batches)


update_rows = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from(["x", "y"]), st.integers(-2, 2)), max_size=12
)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(update_rows, st.integers(0, 3)), min_size=1, max_size=14))
def test_every_merge_output_is_its_consolidated_input(intervals):
    """Real merges on an in-memory shard: each round's outputs hold exactly
    the consolidated (forwarded to since) updates of their inputs, and the
    snapshot at the upper never changes."""
    blob_uri, consensus_uri = memory_stores()
    with Shard.open("s", blob=blob_uri, consensus=consensus_uri, create=True) as shard:
        writer = shard.writer()
        for i, (rows, lag) in enumerate(intervals):
            table = updates([(k, v, i, d) for k, v, d in rows if d != 0])
            writer.compare_and_append_table(table, i, i + 1)
            if i - lag > shard.since:
                shard.advance_since(i - lag)
        expected = shard.reader().snapshot()
        machine, schema = shard.machine, shard.schema
        while True:
            before = machine.state(refresh=True)
            runs = spine.merges(before)
            report = spine_pass(shard, target_bytes=1 << 20)
            assert report.applied == len(runs) and report.skipped == 0
            if not runs:
                break
            after = machine.state(refresh=True)
            for run in runs:
                (out,) = [
                    b
                    for b in after.batches.values()
                    if (b.lower, b.upper) == (run[0].lower, run[-1].upper)
                ]
                inputs = [load_part(shard.blob, "s", p, schema) for b in run for p in b.parts]
                want = P.consolidate(P.forward(P.concat(inputs, schema), before.since))
                got = P.consolidate(
                    P.concat([load_part(shard.blob, "s", p, schema) for p in out.parts], schema)
                )
                assert rows_of(got) == rows_of(want)
                assert out.rows == want.num_rows
        state = machine.state(refresh=True)
        assert len(state.batches) <= spine.batch_bound(state)
        # one part per batch here, inline only below the limit: the budget is bounded
        assert state.inline_bytes < spine.batch_bound(state) * state.inline_max_bytes
        assert rows_of(shard.reader().snapshot()) == rows_of(expected)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=60), st.integers(0, 40))
def test_a_pass_is_due_once_it_removes_slack_batches(sizes, slack):
    state = s0()
    for i, rows in enumerate(sizes):
        batch = Batch(f"a{i}", i, i + 1, (), rows)
        state = msgspec.structs.replace(state, batches={**state.batches, batch.id: batch})
    removed = len(state.batches) - len(_exact_round(state).batches)
    assert spine.removed(spine.merges(state)) == removed
    assert spine.pass_due(spine.merges(state), slack) == (removed >= max(1, slack))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=40), st.data())
def test_a_pass_beside_a_running_one_merges_only_newer_batches(sizes, data):
    """With a wall (the inputs of a pass in flight), the next pass takes only
    batches newer than all of them, and leaves those within the rule."""
    state = s0()
    for i, rows in enumerate(sizes):
        batch = Batch(f"a{i:03}", i, i + 1, (), rows)
        state = msgspec.structs.replace(state, batches={**state.batches, batch.id: batch})
    order = state.ordered_batches()
    walled = data.draw(st.lists(st.sampled_from(order), unique=True, max_size=5))
    wall = {b.id for b in walled}
    last = max((order.index(b) for b in walled), default=-1)
    runs = spine.merges(state, wall)
    assert all(order.index(b) > last for run in runs for b in run)
    newer = msgspec.structs.replace(state, batches={b.id: b for b in order[last + 1 :]})
    assert runs == spine.merges(newer)


def _state_of(sizes, part_bytes=100):
    state = s0()
    part = InlinePart(data=b"x" * part_bytes, rows=1, ts_lo=0, ts_hi=0)
    for i, rows in enumerate(sizes):
        batch = Batch(f"a{i:03}", i, i + 1, (part,), rows)
        state = msgspec.structs.replace(state, batches={**state.batches, batch.id: batch})
    return state


CAPS = (1_000, 10_000, None)


def test_a_run_goes_to_the_smallest_free_lane_it_fits():
    # two big old batches within the rule, then 30 small ones of 100 bytes
    state = _state_of([1 << 20] + [1 << 19] + [1] * 30)
    order = state.ordered_batches()
    lane, (run,) = spine.next_pass(state, {}, slack=8, caps=(10_000, None))
    assert lane == 0 and run == order[2:]  # 30 small: 3,000 bytes, within lane 0
    lane, (run,) = spine.next_pass(state, {}, slack=8, caps=CAPS)
    assert lane == 1 and run == order[2:]  # beyond lane 0's cap, within lane 1's
    lane, (run,) = spine.next_pass(state, {0: set()}, slack=8, caps=(10_000, None))
    assert lane == 1 and run == order[2:]  # lane 0 busy: the next one up


def test_the_largest_free_lane_merges_the_newest_batches_when_no_free_lane_fits():
    state = _state_of([1 << 20] + [1 << 19] + [1] * 30)
    order = state.ordered_batches()
    busy = {2: {order[0].id}}
    # the rule's run (the 30 small) fits lane 1: taken whole
    lane, (run,) = spine.next_pass(state, busy, slack=8, caps=CAPS)
    assert lane == 1 and run == order[2:]
    # lanes 1 and 2 busy: lane 0 merges the newest batches up to its cap
    lane, (run,) = spine.next_pass(state, {**busy, 1: set()}, slack=8, caps=CAPS)
    assert lane == 0 and run == order[-10:]
    assert spine.next_pass(state, {**busy, 1: set()}, slack=10, caps=CAPS) is None  # removes 9
    assert spine.next_pass(state, {0: set(), 1: set(), 2: set()}, 1, CAPS) is None
