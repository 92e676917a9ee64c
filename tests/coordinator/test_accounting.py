"""The append operator's check: a missing report or a count that does not add
up means no append; and the cluster's wire messages decode strictly."""

from __future__ import annotations

import functools

import msgspec
import pytest

from shardsink import protocol
from shardsink.config import ClusterConfig
from shardsink.coordinator.accounting import (
    AccountingError,
    check,
    check_shards,
    parts_by_host,
    total,
)
from shardsink.persist.state import Batch, BlobPart, InlinePart

LOWER, UPPER = 3000, 4000


def _batch(rows: int, *, inline: bool = False) -> Batch:
    part = (
        InlinePart(b"x" * 10, rows, LOWER, LOWER)
        if inline
        else BlobPart("s/part/k.parquet", 100, rows, LOWER, LOWER)
    )
    return Batch(id=f"b{rows}{inline}", lower=LOWER, upper=UPPER, parts=(part,), rows=rows)


def _report(g: int, w: int, rows: int, **kw) -> protocol.Report:
    return protocol.Report(interval=3, attempt=1, group=g, worker=w, rows=rows, **kw)


def _shared(g: int, contributors: dict[int, int], generation: int = 0) -> protocol.SharedBatch:
    batch = _batch(sum(contributors.values()))
    return protocol.SharedBatch(g, generation, batch, contributors, 1, 100, segment_parts=1)


def _good() -> dict[tuple[int, int], protocol.Report]:
    """Group 0 shares one batch (w1 received it); w0 of group 1 wrote its own."""
    return {
        (0, 0): _report(0, 0, 5, shared=protocol.Contribution(0, 5)),
        (0, 1): _report(
            0, 1, 7, shared=protocol.Contribution(0, 7), received=_shared(0, {0: 5, 1: 7})
        ),
        (1, 0): _report(1, 0, 9, own=_batch(9, inline=True)),
        (1, 1): _report(1, 1, 0),
    }


def _check(reports):
    return check(reports, 2, 2, 3, 1, LOWER, UPPER)


def test_reports_that_add_up_are_appended_together():
    accepted = _check(_good())
    assert accepted.rows == 21
    assert accepted.own_batches == 1 and accepted.shared_batches == {0: 1}
    assert accepted.blob_puts == 1 and len(accepted.batches) == 2
    assert accepted.segment_parts == 1  # the shared batch's; own batches use no channel


def _on_shard(reports: dict, shard: int) -> dict:
    return {k: msgspec.structs.replace(r, shard=shard) for k, r in reports.items()}


def test_every_shards_reports_must_add_up_on_their_own():
    """Shard 1's reports are shard 0's, filed anew: each shard's append holds
    its own batches; a report of the wrong shard, or a shard whose reports do
    not add up, refuses the whole attempt naming the shard."""
    names = ["orders", "lines"]

    check_one = functools.partial(
        check, groups=2, workers=2, interval=3, attempt=1, lower=LOWER, upper=UPPER
    )
    both = [_good(), _on_shard(_good(), 1)]
    accepted = check_shards(both, names, check_one)
    assert [a.rows for a in accepted] == [21, 21]
    summed = total(accepted)
    assert (summed.rows, summed.own_batches, summed.shared_batches) == (42, 2, {0: 2})
    assert summed.batches == accepted[0].batches + accepted[1].batches
    assert total(accepted[:1]) == accepted[0]
    swapped = [_good(), _good()]  # shard 0's reports filed as shard 1's
    with pytest.raises(AccountingError, match=r"shard lines: report filed as g0/w0 .*\(shard 1\)"):
        check_shards(swapped, names, check_one)
    missing = [_good(), {k: r for k, r in _on_shard(_good(), 1).items() if k != (1, 1)}]
    with pytest.raises(AccountingError, match="shard lines: no report from g1/w1"):
        check_shards(missing, names, check_one)
    with pytest.raises(AccountingError, match="reports on 1 shards, not the 2 written"):
        check_shards([_good()], names, check_one)


def test_parts_are_counted_by_the_host_that_built_them():
    reports = _good()
    # group 0 on host 2, group 1 on host 0: its shared batch, its own batch
    assert parts_by_host(reports.values(), {0: 2, 1: 0}.__getitem__, False) == {2: 1, 0: 1}
    host_batch = msgspec.structs.replace(_shared(0, {0: 5, 1: 7}), host=1)
    reports[(0, 1)] = msgspec.structs.replace(reports[(0, 1)], received=host_batch)
    assert parts_by_host(reports.values(), {0: 2, 1: 0}.__getitem__, True) == {1: 1, 0: 1}


def _broken(**changes) -> dict:
    reports = _good()
    for key, report in changes.items():
        g, w = int(key[1]), int(key[3])
        if report is None:
            del reports[(g, w)]
        else:
            reports[(g, w)] = report
    return reports


@pytest.mark.parametrize(
    ("reports", "error"),
    [
        (_broken(g1w1=None), "no report from g1/w1"),
        (_broken(g1w0=_report(1, 0, 9, error="disk full")), "g1/w0 failed: disk full"),
        (_broken(g1w0=_report(1, 0, 10, own=_batch(9))), "reports 10 rows but 9 in its own"),
        (  # the last finisher died: nobody reports the shared batch
            _broken(g0w1=_report(0, 1, 7, shared=protocol.Contribution(0, 7))),
            r"shared batch \(0, 0\) holds rows of \[0, 1\] but nobody received it",
        ),
        (  # a contribution the batch does not list
            _broken(
                g0w1=_report(
                    0, 1, 7, shared=protocol.Contribution(0, 7), received=_shared(0, {1: 7})
                )
            ),
            "lists contributors",
        ),
        (  # a stale report filed under the current attempt
            _broken(g1w1=protocol.Report(interval=3, attempt=0, group=1, worker=1, rows=0)),
            "of attempt 0",
        ),
        (
            _broken(
                g1w1=_report(1, 1, 0, received=_shared(0, {0: 5, 1: 7})),
            ),
            "received a shared batch of group 0",
        ),
    ],
)
def test_reports_that_do_not_add_up_are_not_appended(reports, error):
    with pytest.raises(AccountingError, match=error):
        _check(reports)


def test_a_batch_of_another_interval_is_refused():
    wrong = Batch(id="x", lower=0, upper=1000, parts=(), rows=0)
    with pytest.raises(AccountingError, match=r"covers \[0, 1000\)"):
        _check(_broken(g1w1=_report(1, 1, 0, own=wrong)))


def test_idle_interval_appends_nothing():
    reports = {(g, w): _report(g, w, 0) for g in range(2) for w in range(2)}
    accepted = _check(reports)
    assert accepted.batches == () and accepted.rows == 0


def test_wire_messages_decode_strictly():
    report = _good()[(0, 1)]
    assert protocol.decode_from_child(protocol.encode(report)) == report
    with pytest.raises(msgspec.DecodeError):
        protocol.decode_from_child(
            protocol.encode(protocol.Mint(1, 0, 0, 1, "off", 0, ("w.1",)))
        )  # not a child's message
    with pytest.raises(msgspec.DecodeError):
        protocol.decode_to_child(b"\x81\xa4type\xa4mint")
    with pytest.raises(msgspec.DecodeError):  # an unknown mode
        protocol.decode_to_child(msgspec.msgpack.encode({"type": "mint"}))
    meta = protocol.contribute_meta(protocol.Contribute(1, 0, 1000, 2000, 0, 3, 10, 1, "w.1"))
    assert protocol.decode_contribute(meta).rows == 10
    for bad in ({**meta, "rows": "10"}, {**meta, "extra": 1}, {**meta, "last": 2}):
        with pytest.raises(msgspec.ValidationError):
            protocol.decode_contribute(bad)
    spec = protocol.ChildSpec(0, 1, "c1", "ipc:///a", "ipc:///b", "ipc:///c", 4096, ClusterConfig())
    assert protocol.decode_spec(protocol.encode_spec(spec)) == spec
    with pytest.raises(msgspec.ValidationError, match="groups must be >= 1"):
        protocol.decode_spec(protocol.encode_spec(spec).replace(b'"groups":2', b'"groups":0'))


# --- coalesce host: worker -> group generation -> host batch ------------------------


def _share(g: int, contributors: dict[int, int], host_generation: int = 0) -> protocol.GroupShare:
    return protocol.GroupShare(g, 0, contributors, host_generation, segment_parts=1)


def _host_batch(delivering: int, contributors: dict[int, int], rows: int | None = None):
    batch = _batch(sum(contributors.values()) if rows is None else rows)
    return protocol.SharedBatch(delivering, 0, batch, contributors, 1, 100, segment_parts=2)


def _good_host() -> dict[tuple[int, int], protocol.Report]:
    """Both groups share; w1 finished each group's generation last, and group
    1 finished last at the host builder, so g1/w1 received the host batch."""
    return {
        (0, 0): _report(0, 0, 5, shared=protocol.Contribution(0, 5)),
        (0, 1): _report(
            0, 1, 7, shared=protocol.Contribution(0, 7), delivered=_share(0, {0: 5, 1: 7})
        ),
        (1, 0): _report(1, 0, 9, shared=protocol.Contribution(0, 9)),
        (1, 1): _report(
            1, 1, 0, delivered=_share(1, {0: 9}), received=_host_batch(1, {0: 12, 1: 9})
        ),
    }


def _check_host(reports):
    return check(reports, 2, 2, 3, 1, LOWER, UPPER, host=True)


def test_host_coalesced_reports_that_add_up_append_one_batch():
    accepted = _check_host(_good_host())
    assert accepted.rows == 21 and len(accepted.batches) == 1
    assert accepted.shared_batches == {1: 1} and accepted.own_batches == 0
    assert accepted.segment_parts == 1 + 1 + 2  # both groups' workers' parts, the groups' parts


def _broken_host(**changes) -> dict:
    reports = _good_host()
    for key, report in changes.items():
        reports[(int(key[1]), int(key[3]))] = report
    return reports


@pytest.mark.parametrize(
    ("reports", "error"),
    [
        (  # group 0's last finisher died before it reported where its generation went
            _broken_host(g0w1=_report(0, 1, 7, shared=protocol.Contribution(0, 7))),
            r"group generation \(0, 0\) holds rows of workers \[0, 1\] but no report says it "
            "reached the host builder",
        ),
        (  # the worker that received the host batch died before it reported it
            _broken_host(g1w1=_report(1, 1, 0, delivered=_share(1, {0: 9}))),
            r"host batch 0 holds rows of groups \[0, 1\] but nobody received it",
        ),
        (
            _broken_host(
                g0w1=_report(
                    0, 1, 7, shared=protocol.Contribution(0, 7), delivered=_share(0, {1: 7})
                )
            ),
            r"group generation \(0, 0\) lists contributors \{1: 7\}",
        ),
        (  # a group generation the host batch does not hold
            _broken_host(
                g0w1=_report(
                    0,
                    1,
                    7,
                    shared=protocol.Contribution(0, 7),
                    delivered=_share(0, {0: 5, 1: 7}, host_generation=1),
                )
            ),
            r"host batch 0 lists contributors \{0: 12, 1: 9\}, the reports \{1: 9\}",
        ),
        (
            _broken_host(
                g1w1=_report(
                    1, 1, 0, delivered=_share(1, {0: 9}), received=_host_batch(1, {0: 12, 1: 9}, 20)
                )
            ),
            "host batch 0 holds 20 rows, its contributors 21",
        ),
        (  # the host batch reported by two workers
            _broken_host(
                g0w0=_report(
                    0, 0, 5, shared=protocol.Contribution(0, 5), received=_host_batch(0, {0: 1})
                )
            ),
            "host batch 0 was received twice",
        ),
        (
            _broken_host(
                g1w0=_report(
                    1, 0, 9, shared=protocol.Contribution(0, 9), delivered=_share(0, {0: 5, 1: 7})
                )
            ),
            "g1/w0 delivered a generation of group 0",
        ),
    ],
)
def test_host_coalesced_reports_that_do_not_add_up_are_not_appended(reports, error):
    with pytest.raises(AccountingError, match=error):
        _check_host(reports)


def test_a_group_generation_reported_delivered_without_a_host_builder_is_refused():
    with pytest.raises(AccountingError, match="g0/w1 reports a group generation passed to a host"):
        _check(_good_host())


def test_batches_whose_digests_do_not_add_up_are_refused():
    """A batch that lost, doubled or changed a row holds another digest than
    its workers wrote: the attempt is refused, naming the interval."""
    from shardsink.persist.digest import Digest

    def with_digests(held: Digest) -> dict:
        reports = _good()
        wrote = {(0, 0): Digest(5, 5, 11), (0, 1): Digest(7, 7, 13), (1, 0): Digest(9, 9, 17)}
        out = {}
        for key, r in reports.items():
            changes = {"digest": wrote.get(key, Digest())}
            if r.own is not None:
                changes["own"] = msgspec.structs.replace(r.own, digest=Digest(9, 9, 17))
            if r.received is not None:
                batch = msgspec.structs.replace(r.received.batch, digest=held)
                changes["received"] = msgspec.structs.replace(r.received, batch=batch)
            out[key] = msgspec.structs.replace(r, **changes)
        return out

    assert _check(with_digests(Digest(12, 12, 24))).rows == 21
    for held in (Digest(12, 12, 25), Digest(12, 11, 24), Digest(12, 24, 48)):
        with pytest.raises(AccountingError, match="interval 3: its batches hold"):
            _check(with_digests(held))
