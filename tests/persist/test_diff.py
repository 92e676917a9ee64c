"""State diffs: each transition's diff (``step``) turns the version before
into its next (``apply_diff``) through a MessagePack round trip, and holds
what a comparison of the two versions finds (:func:`compared`), no more."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import Phase, find, given, settings, strategies as st

from shardsink.persist import diff as D
from shardsink.persist.commands import (
    AddRollup,
    AdvanceSince,
    ApplyCompaction,
    CompareAndAppend,
    ExpireReader,
    ExpireReaders,
    ExpireWriter,
    ExpireWriters,
    ForgetRetired,
    ForgetRollups,
    HeartbeatReader,
    HeartbeatWriter,
    LeaseSeqno,
    RegisterReader,
    RegisterWriter,
    Retain,
)
from shardsink.persist.state import BlobPart, ShardState
from shardsink.persist.transitions import Step, step
from tests.helpers.persist import W1, apply, blob_batch, inline_batch, s0

names = st.sampled_from(["a", "b", "c"])


def writer_id(draw, state: ShardState) -> str | None:
    """A registered writer's id, or ``None`` if there is none."""
    return draw(st.sampled_from(sorted(state.writers))) if state.writers else None


@st.composite
def command(draw, state: ShardState):
    kind = draw(st.integers(0, 10))
    up = state.upper
    writer = writer_id(draw, state)
    if writer is None and kind in (0, 1, 2, 7):
        return RegisterWriter(draw(names))  # appends and compactions need a writer
    if kind <= 2:
        new_upper = up + draw(st.integers(1, 3))
        batches = [
            blob_batch(f"b{state.seqno}-{i}", up, new_upper, writer=writer)
            if draw(st.booleans())
            else inline_batch(f"b{state.seqno}-{i}", up, new_upper)
            for i in range(draw(st.integers(0, 2)))
        ]
        return CompareAndAppend(writer, f"t{state.seqno}", tuple(batches), up, new_upper)
    if kind == 3:
        return RegisterReader(draw(names), draw(st.integers(1, 50)))
    if kind == 4:
        return draw(st.sampled_from([LeaseSeqno, HeartbeatReader, ExpireReader]))(draw(names))
    if kind == 5:
        return draw(
            st.sampled_from(
                [
                    ExpireReaders(),
                    HeartbeatWriter(writer or W1),
                    ExpireWriter(writer or W1),
                    ExpireWriters(draw(st.integers(1, 50))),
                    Retain(draw(st.integers(1, 5))),
                ]
            )
        )
    if kind == 6:
        return AdvanceSince(draw(st.integers(0, max(up, 0))))
    if kind == 7:
        order = state.ordered_batches()
        if len(order) < 2:
            return RegisterWriter(draw(names))
        i = draw(st.integers(0, len(order) - 2))
        run = order[i : i + 2]
        out = blob_batch(f"c{state.seqno}", run[0].lower, max(b.upper for b in run), writer=writer)
        return ApplyCompaction(tuple(b.id for b in run), out, writer)
    if kind == 8:
        return AddRollup(state.seqno, f"s/rollup/{state.seqno}")
    if kind == 9:
        return ForgetRollups(draw(st.sampled_from(sorted(state.rollups))))
    return ForgetRetired(tuple(draw(st.lists(st.sampled_from(sorted(state.retired) or [0])))))


@st.composite
def history(draw, steps: int = 25) -> list[tuple[ShardState, object, Step]]:
    """A random history from :func:`s0`: each command that made a new
    version, with the state before it and its step (next version and diff)."""
    state, made = s0(), []
    for n in range(steps):
        cmd = draw(command(state), label=f"command {n}")
        next_version, _ = step(state, cmd, n * 10)
        if next_version is not None:
            made.append((state, cmd, next_version))
            state = next_version.new
    return made


def compared(old: ShardState, new: ShardState) -> D.StateDiff:
    """The diff from ``old`` to ``new`` found by comparing them field by
    field and entry by entry (deleted keys sorted): what a transition's own
    diff must hold."""
    changes: dict[str, object] = {}
    for name in D.SCALAR_FIELDS:
        if getattr(old, name) != getattr(new, name):
            changes[name] = getattr(new, name)
    for name in D.MAP_FIELDS:
        before, after = getattr(old, name), getattr(new, name)
        put = {k: v for k, v in after.items() if before.get(k) != v}
        gone = tuple(sorted(k for k in before if k not in after))
        if put:
            changes[f"{name}_put"] = put
        if gone:
            changes[f"{name}_del"] = gone
    return D.StateDiff(shard=new.shard, seqno=new.seqno, rollup=new.latest_rollup(), **changes)


def sorted_deletes(d: D.StateDiff) -> D.StateDiff:
    deletes = {f"{name}_del": tuple(sorted(getattr(d, f"{name}_del"))) for name in D.MAP_FIELDS}
    return msgspec.structs.replace(d, **deletes)


@settings(max_examples=60, deadline=None)
@given(history())
def test_each_transition_diff_turns_its_version_into_the_next(steps):
    for state, _, made in steps:
        d = D.decode_diff(D.encode_diff(made.diff))
        assert D.apply_diff(state, d) == made.new
        assert d.rollup == made.new.latest_rollup()
        assert sorted_deletes(made.diff) == compared(state, made.new)


def test_random_histories_reach_appends_and_compactions():
    """The histories above append and compact (which take a registered
    writer, and parts under its prefix), not only have them refused."""
    kinds = {"RegisterWriter", "CompareAndAppend", "ApplyCompaction", "ExpireWriters"}
    found = find(
        history().map(lambda steps: [(cmd, made.new.batches) for _, cmd, made in steps]),
        lambda steps: kinds <= {type(cmd).__name__ for cmd, _ in steps},
        settings=settings(
            phases=[Phase.generate], database=None, derandomize=True, max_examples=500
        ),
    )
    parts = [p for _, batches in found for b in batches.values() for p in b.parts]
    assert any(isinstance(p, BlobPart) for p in parts)


def test_diff_covers_every_state_field():
    fields = {f.name for f in msgspec.structs.fields(ShardState)}
    assert fields == {"seqno", *D.FIXED_FIELDS, *D.SCALAR_FIELDS, *D.MAP_FIELDS}
    diff_fields = {f.name for f in msgspec.structs.fields(D.StateDiff)}
    for name in D.MAP_FIELDS:
        assert {f"{name}_put", f"{name}_del"} <= diff_fields
    assert set(D.SCALAR_FIELDS) <= diff_fields


def test_diff_of_one_append_carries_only_the_new_batch_and_the_writer():
    state, _ = apply(s0(), RegisterWriter("w"), 0)
    for i in range(50):
        state, _ = apply(
            state, CompareAndAppend(W1, f"t{i}", (blob_batch(f"b{i}", i, i + 1),), i, i + 1), 0
        )
    assert state.upper == 50 and len(state.batches) == 50
    made, _ = step(state, CompareAndAppend(W1, "x", (blob_batch("n", 50, 51),), 50, 51), 0)
    d = made.diff
    assert set(d.batches_put) == {"n"} and d.batches_del == () and d.upper == 51
    assert set(d.writers_put) == {W1} and d.inline_bytes is None  # blob parts only


def test_next_version_leaves_out_what_does_not_change_and_refuses_other_fields():
    state, _ = apply(s0(), RegisterWriter("w"), 0)
    new, d = D.next_version(
        state,
        upper=state.upper,
        writers_put={W1: state.writers[W1]},
        readers_del=("nobody",),
        since=3,
    )
    assert d == D.StateDiff(shard=state.shard, seqno=2, rollup=state.latest_rollup(), since=3)
    assert new.since == 3 and new.seqno == 2 and new.writers == state.writers
    with pytest.raises(TypeError, match="'schema' is not a field"):
        D.next_version(state, schema=b"other")
    with pytest.raises(TypeError, match="'writers' is not a field"):
        D.next_version(state, writers={})


def test_a_diff_applies_only_to_the_version_before_it_of_its_shard():
    state = s0()
    for d in (
        D.StateDiff(shard="other", seqno=1, rollup=state.latest_rollup()),
        D.StateDiff(shard=state.shard, seqno=2, rollup=state.latest_rollup()),
    ):
        with pytest.raises(ValueError, match="does not apply"):
            D.apply_diff(state, d)


def test_corrupt_diff_bytes_do_not_decode():
    with pytest.raises(msgspec.DecodeError):
        D.decode_diff(b"\x92\x01garbage")
