"""The reference thread's cases through a real builder process, driven by
test-side workers over the real shared-memory channel."""

from __future__ import annotations

import threading
import time

import pytest

from shardsink import protocol
from shardsink.shm import TransportTimeout
from tests.helpers.cluster import EMPTY, WRITER, BuilderHarness, rows_batch


@pytest.mark.parametrize("both_push", [True, False], ids=["both-pushed", "one-pushed"])
def test_two_handles_race_finish_5000_times(both_push):
    """Both handles are open (their joins taken), then both finish at once,
    5,000 times: exactly one receives the batch, holding every handle's rows."""
    rounds = 5000
    with BuilderHarness(2, mode="best-effort") as h:
        start = threading.Barrier(2)
        answers: list[list[protocol.Handoff]] = [[], []]
        errors: list[BaseException] = []

        def run(w: int) -> None:
            worker = h.workers[w]
            try:
                for i in range(rounds):
                    worker.send((i, 0), EMPTY, last=False)  # join
                    worker.sync()
                    start.wait(30)
                    if w == 0 or both_push:
                        worker.send((i, 0), rows_batch([2 * i + w], i * 1000), last=True)
                    else:
                        worker.send((i, 0), EMPTY, last=True)
                    answers[w].append(worker.answer())
            except BaseException as exc:
                errors.append(exc)
                start.abort()

        threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        if any(t.is_alive() for t in threads):
            pytest.fail("a worker thread is stuck" + h.builder.log_tail())
        if errors:
            pytest.fail(
                "\n".join(f"{type(e).__name__}: {e}" for e in errors) + h.builder.log_tail()
            )
        last_by = {0: 0, 1: 0}
        for i in range(rounds):
            got = [a for a in (answers[0][i], answers[1][i]) if a.shared is not None]
            assert all((a.interval, a.error) == (i, None) for a in (answers[0][i], answers[1][i]))
            assert len(got) == 1, (i, answers[0][i], answers[1][i])
            shared = got[0].shared
            expected = {0: 1, 1: 1} if both_push else {0: 1}
            assert shared.contributors == expected
            assert shared.batch.rows == sum(expected.values())
            last_by[answers[1][i].shared is not None] += 1
        assert min(last_by.values()) > 0, f"one side was always last: {last_by}"


def test_barrier_hands_one_batch_to_the_last_of_all_workers():
    with BuilderHarness(3, mode="barrier") as h:
        a, b, c = h.workers
        a.send((0, 0), rows_batch([0, 3], 0), last=True, barrier=True)
        c.send((0, 0), EMPTY, last=True, barrier=True)  # nothing this interval
        assert a.answer().shared is None and c.answer().shared is None
        sent = time.monotonic()
        b.send((0, 0), rows_batch([1], 0), last=True, barrier=True)
        shared = b.answer().shared
        waited = time.monotonic() - sent
        assert shared is not None and shared.contributors == {0: 2, 1: 1}
        assert shared.batch.rows == 3 and len(shared.batch.parts) == 1
        # the builder's lag runs from taking b's finish to the handoff: within b's wait
        assert 0 < shared.lag_s < waited


def test_abandoned_shared_batch_deletes_its_parts_and_releases_the_arena():
    """Reference ``test_shared_batch_abandoned``: parts already written for an
    abandoned attempt are deleted, parts still held are released to their
    senders, and nobody receives anything of it."""
    with BuilderHarness(2, mode="best-effort", blob_target_bytes=4000) as h:
        a, b = h.workers
        a.send((0, 0), rows_batch(list(range(100)), 0), last=False)  # written at once
        a.sync()
        b.send((0, 0), rows_batch([500], 0), last=False)  # held: below the target
        assert len(h.blob_parts()) == 1
        with pytest.raises(TransportTimeout):
            b.sync(0.5)
        h.tell(protocol.Abandon(0, 0))
        b.sync()  # released by the abort
        assert h.blob_parts() == []
        a.send((0, 0), EMPTY, last=True)
        answer = a.answer()
        assert answer.shared is None and "abandoned" in answer.error
        # the next attempt starts clean
        b.send((0, 1), rows_batch([7], 0), last=True)
        again = b.answer()
        assert again.shared is not None and again.shared.contributors == {1: 1}


def test_two_descriptions_for_one_batch_id_are_refused():
    with BuilderHarness(2, mode="best-effort") as h:
        a, b = h.workers
        a.send((4, 0), EMPTY, last=False)
        a.sync()  # taken: the id is described
        b.send((4, 0), rows_batch([1], 4000), last=True, upper=9000)
        answer = b.answer()
        assert answer.shared is None
        assert "ConflictingDescription" in answer.error and "(4, 0)" in answer.error
        a.send((4, 0), rows_batch([2], 4000), last=True)
        assert a.answer().shared.contributors == {0: 1}


def test_a_part_whose_count_is_wrong_is_refused():
    with BuilderHarness(1, mode="best-effort") as h:
        (a,) = h.workers
        batch = rows_batch([1, 2], 0)
        meta = protocol.Contribute(0, 0, 0, 1000, 0, 0, rows=5, last=1, writer=WRITER)
        a.sender.send(batch, protocol.contribute_meta(meta))
        answer = a.answer()
        assert answer.shared is None and "says 5 rows and holds 2" in answer.error


def test_handle_dropped_without_finishing():
    """Reference ``test_shared_batch_dropped_handle``: a worker whose handle is
    dropped (here: its last part is refused) leaves its pushed rows to the
    last finisher; if it held the last open handle, nobody receives the batch
    and its written parts are deleted."""
    with BuilderHarness(2, mode="best-effort", blob_target_bytes=1) as h:
        a, b = h.workers

        def bad_last(bid):
            meta = protocol.Contribute(
                bid[0], bid[1], bid[0] * 1000, bid[0] * 1000 + 1000, 0, 0, 9, 1, WRITER
            )
            a.sender.send(rows_batch([99], bid[0] * 1000), protocol.contribute_meta(meta))
            return a.answer()

        a.send((0, 0), rows_batch([0, 2], 0), last=False)
        b.send((0, 0), EMPTY, last=False)
        a.sync()
        b.sync()
        assert "says 9 rows and holds 1" in bad_last((0, 0)).error
        b.send((0, 0), rows_batch([1], 0), last=True)
        shared = b.answer().shared
        assert shared.contributors == {0: 2, 1: 1} and shared.batch.rows == 3
        written = len(h.blob_parts())
        a.send((1, 0), rows_batch([10, 12], 1000), last=False)
        a.sync()
        assert len(h.blob_parts()) == written + 1
        assert "says 9 rows" in bad_last((1, 0)).error  # the last open handle: orphaned
        assert len(h.blob_parts()) == written


def test_best_effort_linger_through_the_builder():
    """A finish that would hand the batch off before every worker joined is
    held: a worker that joins during the linger receives the one batch, and
    once the linger runs out the deferred finisher receives it alone."""
    linger_s = 1.0
    with BuilderHarness(3, mode="best-effort", best_effort_linger_ms=int(linger_s * 1000)) as h:
        a, b, _ = h.workers
        a.send((0, 0), rows_batch([0], 0), last=True)
        time.sleep(linger_s / 5)  # a's finish is deferred (its part stays held: no sync)
        b.send((0, 0), rows_batch([1, 2], 0), last=True)
        shared = b.answer().shared
        assert shared is not None and shared.contributors == {0: 1, 1: 2}
        assert shared.batch.rows == 3
        assert a.answer().shared is None
        started = time.monotonic()
        a.send((1, 0), rows_batch([5], 1000), last=True)
        alone = a.answer()
        assert time.monotonic() - started >= linger_s * 0.9
        assert alone.error is None and alone.shared.contributors == {0: 1}


def test_a_sender_that_finishes_and_joins_again_in_one_burst_gets_two_answers():
    """A group builder under ``coalesce`` host finishes its handle on a batch
    id and joins it again (a late worker started a second group generation)
    in quick succession: the builder decides the first finish before it takes
    the second join, so both handles are answered, neither with an error."""
    with BuilderHarness(1, mode="best-effort", best_effort_linger_ms=0) as h:
        worker = h.workers[0]
        for i in range(50):
            for key in (i, i + 1000):
                worker.send((i, 0), EMPTY, last=False)
                worker.send((i, 0), rows_batch([key], i * 1000), last=True)
            answers = [worker.answer(), worker.answer()]
            assert [(a.error, a.generation) for a in answers] == [(None, 0), (None, 1)]
            assert [a.shared.batch.rows for a in answers] == [1, 1]
