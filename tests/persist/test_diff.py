"""State diffs: ``apply_diff(old, diff(old, new)) == new`` for every
transition, through a MessagePack round trip."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

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
from shardsink.persist.transitions import apply
from tests.helpers.persist import W1, blob_batch, inline_batch, s0

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
def history(draw, steps: int = 25) -> list[tuple[ShardState, object, ShardState]]:
    """A random history from :func:`s0`: each command that made a new
    version, with the states before and after it."""
    state, made = s0(), []
    for step in range(steps):
        cmd = draw(command(state), label=f"command {step}")
        new, _ = apply(state, cmd, step * 10)
        if new is not None:
            made.append((state, cmd, new))
            state = new
    return made


@settings(max_examples=60, deadline=None)
@given(history())
def test_apply_diff_inverts_diff_along_random_histories(steps):
    for state, _, new in steps:
        d = D.decode_diff(D.encode_diff(D.diff(state, new)))
        assert D.apply_diff(state, d) == new
        assert d.rollup == new.latest_rollup()


def test_random_histories_reach_appends_and_compactions():
    """The histories above append and compact (which take a registered
    writer, and parts under its prefix), not only have them refused."""
    kinds = {"RegisterWriter", "CompareAndAppend", "ApplyCompaction", "ExpireWriters"}
    found = find(
        history(),
        lambda steps: kinds <= {type(cmd).__name__ for _, cmd, _ in steps},
        settings=settings(
            phases=[Phase.generate], database=None, derandomize=True, max_examples=500
        ),
    )
    parts = [p for _, _, new in found for b in new.batches.values() for p in b.parts]
    assert any(isinstance(p, BlobPart) for p in parts)


def test_diff_covers_every_state_field():
    fields = {f.name for f in msgspec.structs.fields(ShardState)}
    assert fields == {"seqno", *D.FIXED_FIELDS, *D.SCALAR_FIELDS, *D.MAP_FIELDS}
    diff_fields = {f.name for f in msgspec.structs.fields(D.StateDiff)}
    for name in D.MAP_FIELDS:
        assert {f"{name}_put", f"{name}_del"} <= diff_fields
    assert set(D.SCALAR_FIELDS) <= diff_fields


def test_diff_of_one_append_carries_only_the_new_batch():
    state, _ = apply(s0(), RegisterWriter("w"), 0)
    for i in range(50):
        state, _ = apply(
            state, CompareAndAppend(W1, f"t{i}", (blob_batch(f"b{i}", i, i + 1),), i, i + 1), 0
        )
    assert state.upper == 50 and len(state.batches) == 50
    new, _ = apply(state, CompareAndAppend(W1, "x", (blob_batch("n", 50, 51),), 50, 51), 0)
    d = D.diff(state, new)
    assert set(d.batches_put) == {"n"} and d.batches_del == () and d.upper == 51


def test_diff_refuses_non_consecutive_or_fixed_changes():
    state = s0()
    with pytest.raises(ValueError, match="does not follow"):
        D.diff(state, state)
    changed = msgspec.structs.replace(state, seqno=1, schema=b"other")
    with pytest.raises(ValueError, match="may not change"):
        D.diff(state, changed)
    d = D.StateDiff(shard="other", seqno=1, rollup=state.latest_rollup())
    with pytest.raises(ValueError, match="does not apply"):
        D.apply_diff(state, d)


def test_corrupt_diff_bytes_do_not_decode():
    with pytest.raises(msgspec.DecodeError):
        D.decode_diff(b"\x92\x01garbage")
