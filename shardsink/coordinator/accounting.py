"""The append operator's check: do the workers' reports add up?

An interval is appended only if every worker of the cluster reported on the
same attempt without an error, every report's rows are in exactly one batch,
every shared contribution is in exactly one shared batch that some worker
received (whose contributor list matches the contributions exactly), and the
rows of all batches equal the rows all workers reported. With ``coalesce``
host there is one level more: every shared contribution is in exactly one
group generation (the one its last finisher reports delivered, contributors
matching exactly), and every group generation with rows in exactly one host
batch that exactly one worker received, whose contributors (group -> rows)
are the sums of the group generations delivered into it. Anything else
rejects the attempt: no append, so no interval is ever sealed with missing or
doubled data. Then the content: the digests of the batches
(:mod:`shardsink.persist.digest`, computed by whoever wrote each from the
rows it wrote) must add up to those the workers report for what they
produced, in sum of diffs and hash, so a batch that lost, doubled or changed
a row is never appended (skipped when digests are off). A workload of
several shards is checked shard by shard (:func:`check_shards`): every
worker reports on every shard, and each shard's reports, batches and
digests must add up on their own. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from ..persist import Batch, total_known
from ..protocol import GroupShare, Report, SharedBatch


class AccountingError(ValueError):
    """The reports of an attempt do not add up; the message says how."""


class Accepted(msgspec.Struct, frozen=True):
    """What to append for an attempt, and what it consists of
    (``segment_parts``: see :class:`~shardsink.protocol.SharedBatch`)."""

    batches: tuple[Batch, ...]
    rows: int
    own_batches: int
    shared_batches: dict[int, int]  # group -> shared batches appended
    blob_puts: int
    blob_put_bytes: int
    segment_parts: int


def check(
    reports: Mapping[tuple[int, int], Report],
    groups: int,
    workers: int,
    interval: int,
    attempt: int,
    lower: int,
    upper: int,
    *,
    host: bool = False,
    shard: int = 0,
) -> Accepted:
    """Check the reports of attempt ``attempt`` of ``interval`` (``[lower,
    upper)``) on shard ``shard`` (its index), keyed by (group, worker);
    return what to append or raise :class:`AccountingError`. ``host``: the
    shared batches were coalesced by a host builder (``coalesce`` host), so
    every group generation must be in exactly one host batch that exactly
    one worker received."""
    # Two checks, in this order: every report alone (who, which attempt and
    # shard, its own batch), then the shared batches against what the reports
    # say went into them; the first error of either rejects the attempt.
    ledger = _check_reports(
        reports, groups, workers, (interval, attempt, shard), lower, upper, host
    )
    shared_batches, segment_parts = _check_shared(ledger, lower, upper, host)
    batch_rows = sum(b.rows for b in ledger.batches)
    if batch_rows != ledger.reported_rows:
        raise AccountingError(
            f"the batches hold {batch_rows} rows, the reports {ledger.reported_rows}"
        )
    _check_digests(interval, reports.values(), ledger.batches)
    return Accepted(
        batches=tuple(ledger.batches),
        rows=batch_rows,
        own_batches=ledger.own_batches,
        shared_batches=shared_batches,
        blob_puts=ledger.blob_puts,
        blob_put_bytes=ledger.blob_put_bytes,
        segment_parts=segment_parts,
    )


def check_shards(
    reports: Sequence[Mapping[tuple[int, int], Report]],
    names: Sequence[str],
    check_one: Callable[..., Accepted],
) -> list[Accepted]:
    """Every shard's check: ``reports[i]`` are shard ``i``'s (named
    ``names[i]``), keyed by (group, worker), and ``check_one(reports[i],
    shard=i)`` checks them (:func:`check` with the attempt's figures).
    What to append to each, in order, or :class:`AccountingError` naming
    the first shard whose reports do not add up (then nothing of the
    attempt may be appended, to any shard)."""
    if len(reports) != len(names):
        raise AccountingError(f"reports on {len(reports)} shards, not the {len(names)} written")
    accepted = []
    for index, (by_worker, name) in enumerate(zip(reports, names, strict=True)):
        try:
            accepted.append(check_one(by_worker, shard=index))
        except AccountingError as exc:
            raise AccountingError(f"shard {name}: {exc}") from None
    return accepted


def total(accepted: Sequence[Accepted]) -> Accepted:
    """What the shards' ``accepted`` add up to (their figures summed, their
    batches together): an interval's figures, whatever its shards."""
    if len(accepted) == 1:
        return accepted[0]
    shared: dict[int, int] = {}
    for a in accepted:
        for group, n in a.shared_batches.items():
            shared[group] = shared.get(group, 0) + n
    return Accepted(
        batches=tuple(b for a in accepted for b in a.batches),
        rows=sum(a.rows for a in accepted),
        own_batches=sum(a.own_batches for a in accepted),
        shared_batches=shared,
        blob_puts=sum(a.blob_puts for a in accepted),
        blob_put_bytes=sum(a.blob_put_bytes for a in accepted),
        segment_parts=sum(a.segment_parts for a in accepted),
    )


@dataclass
class _Ledger:
    """What the reports of one attempt say, gathered by
    :func:`_check_reports` and matched by :func:`_check_shared`.

    ``claimed``: (group, generation) -> worker -> the rows it says it put in
    that shared batch; ``received``: shared (or host) batch key -> the batch a
    worker says it received; ``delivered``: (group, generation) -> the group
    generation its last finisher says reached the host builder; ``batches``:
    the batches to append so far (own batches, then shared ones)."""

    claimed: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    received: dict[tuple[int, int], SharedBatch] = field(default_factory=dict)
    delivered: dict[tuple[int, int], GroupShare] = field(default_factory=dict)
    batches: list[Batch] = field(default_factory=list)
    reported_rows: int = 0
    own_batches: int = 0
    blob_puts: int = 0
    blob_put_bytes: int = 0


def _check_reports(
    reports: Mapping[tuple[int, int], Report],
    groups: int,
    workers: int,
    attempt_of: tuple[int, int, int],
    lower: int,
    upper: int,
    host: bool,
) -> _Ledger:
    """The first check: every worker of the cluster reported, each report is
    the one filed under its key (``attempt_of``: the interval, attempt and
    shard it must be about), without an error, its rows split exactly
    between its own batch and its shared contribution, its own batch covers
    ``[lower, upper)``, and no shared batch was received nor group generation
    delivered twice. Returns what the reports say, for :func:`_check_shared`;
    raises :class:`AccountingError` at the first report (in (group, worker)
    order) that fails."""
    missing = [f"g{g}/w{w}" for g in range(groups) for w in range(workers) if (g, w) not in reports]
    if missing:
        raise AccountingError(f"no report from {', '.join(missing)}")
    ledger = _Ledger()
    interval, attempt, shard = attempt_of
    for (g, w), r in sorted(reports.items()):
        who = f"g{g}/w{w}"
        if (r.interval, r.attempt, r.shard, r.group, r.worker) != (*attempt_of, g, w):
            raise AccountingError(
                f"report filed as {who} of attempt {attempt} of interval {interval} "
                f"(shard {shard}) is g{r.group}/w{r.worker} of attempt {r.attempt} of interval "
                f"{r.interval} (shard {r.shard})"
            )
        if r.error is not None:
            raise AccountingError(f"{who} failed: {r.error}")
        ledger.reported_rows += r.rows
        own_rows = r.own.rows if r.own is not None else 0
        shared_rows = r.shared.rows if r.shared is not None else 0
        if own_rows + shared_rows != r.rows:
            raise AccountingError(
                f"{who} reports {r.rows} rows but {own_rows} in its own batch and "
                f"{shared_rows} shared"
            )
        if r.own is not None:
            _check_description(r.own, lower, upper, who)
            ledger.batches.append(r.own)
            ledger.own_batches += 1
        if r.shared is not None and r.shared.rows:
            ledger.claimed.setdefault((g, r.shared.generation), {})[w] = r.shared.rows
        if r.received is not None:
            _note_received(ledger, r.received, g, who, host)
        if r.delivered is not None:
            _note_delivered(ledger, r.delivered, g, who, host)
        ledger.blob_puts += r.blob_puts
        ledger.blob_put_bytes += r.blob_put_bytes
    return ledger


def _note_received(ledger: _Ledger, shared: SharedBatch, g: int, who: str, host: bool) -> None:
    """Record the shared batch worker ``who`` of group ``g`` received;
    :class:`AccountingError` if it is another group's or was already
    received."""
    # a group's batch is keyed by its group and generation; a host batch by its
    # host builder and that one's generation
    key = (shared.host if host else shared.group, shared.generation)
    if shared.group != g:
        raise AccountingError(f"{who} received a shared batch of group {shared.group}")
    if key in ledger.received:
        raise AccountingError(f"{_name(key, host)} was received twice")
    ledger.received[key] = shared


def _note_delivered(ledger: _Ledger, share: GroupShare, g: int, who: str, host: bool) -> None:
    """Record the group generation worker ``who`` of group ``g`` passed to the
    host builder; :class:`AccountingError` without a host builder, for another
    group's generation, or one already delivered."""
    if not host:
        raise AccountingError(f"{who} reports a group generation passed to a host builder")
    if share.group != g:
        raise AccountingError(f"{who} delivered a generation of group {share.group}")
    key = (g, share.generation)
    if key in ledger.delivered:
        raise AccountingError(f"group generation {key} was delivered twice")
    ledger.delivered[key] = share


def _check_shared(
    ledger: _Ledger, lower: int, upper: int, host: bool
) -> tuple[dict[int, int], int]:
    """The second check: every shared batch (with ``host``, every host batch,
    after :func:`_host_level` matched the group generations) that holds rows
    was received by a worker, lists exactly the contributions the reports
    claim, holds their rows and covers ``[lower, upper)``. Appends each to
    ``ledger.batches`` and adds its blob puts; returns group -> shared batches
    appended and the segment parts of all levels. :class:`AccountingError` at
    the first (in key order) that fails."""
    claimed = ledger.claimed
    segment_parts = 0
    if host:
        claimed, segment_parts = _host_level(claimed, ledger.delivered)
    shared_batches: dict[int, int] = {}
    for key in sorted(claimed.keys() | ledger.received.keys()):
        shared = ledger.received.get(key)
        contributions = claimed.get(key, {})
        name = _name(key, host)
        if shared is None:
            raise AccountingError(
                f"{name} holds rows of {_members(contributions, host)} but nobody received it"
            )
        if shared.contributors != contributions:
            raise AccountingError(
                f"{name} lists contributors {shared.contributors}, the reports {contributions}"
            )
        if shared.batch.rows != sum(contributions.values()):
            raise AccountingError(
                f"{name} holds {shared.batch.rows} rows, its contributors "
                f"{sum(contributions.values())}"
            )
        _check_description(shared.batch, lower, upper, name)
        ledger.batches.append(shared.batch)
        shared_batches[shared.group] = shared_batches.get(shared.group, 0) + 1
        ledger.blob_puts += shared.blob_puts
        ledger.blob_put_bytes += shared.blob_put_bytes
        segment_parts += shared.segment_parts
    return shared_batches, segment_parts


def _host_level(
    claimed: dict[tuple[int, int], dict[int, int]], delivered: dict[tuple[int, int], GroupShare]
) -> tuple[dict[tuple[int, int], dict[int, int]], int]:
    """Every group generation's contributions matched against the generation
    its last finisher delivered; returns what the host batches must hold,
    keyed as received host batches are (``(host, host generation)`` ->
    group -> rows), and the segment parts of the group generations."""
    at_host: dict[tuple[int, int], dict[int, int]] = {}
    segment_parts = 0
    for key in sorted(claimed.keys() | delivered.keys()):
        share = delivered.get(key)
        contributions = claimed.get(key, {})
        if share is None:
            raise AccountingError(
                f"group generation {key} holds rows of workers {sorted(contributions)} but "
                "no report says it reached the host builder"
            )
        if share.contributors != contributions:
            raise AccountingError(
                f"group generation {key} lists contributors {share.contributors}, the "
                f"reports {contributions}"
            )
        segment_parts += share.segment_parts
        rows = sum(contributions.values())
        if rows:
            host = at_host.setdefault((share.host, share.host_generation), {})
            host[key[0]] = host.get(key[0], 0) + rows
    return at_host, segment_parts


def _check_digests(interval: int, reports: Iterable[Report], batches: Iterable[Batch]) -> None:
    wrote = total_known(r.digest for r in reports)
    held = total_known(b.digest for b in batches)
    if wrote is not None and held is not None and not held.same_content(wrote):
        raise AccountingError(
            f"interval {interval}: its batches hold {held.describe()}, its workers wrote "
            f"{wrote.describe()}"
        )


def _name(key: tuple[int, int], host: bool) -> str:
    if not host:
        return f"shared batch {key}"
    return f"host batch {key[1]}" if key[0] == 0 else f"host {key[0]}'s batch {key[1]}"


def _members(contributions: dict[int, int], host: bool) -> str:
    return f"groups {sorted(contributions)}" if host else str(sorted(contributions))


def _check_description(batch: Batch, lower: int, upper: int, who: str) -> None:
    if (batch.lower, batch.upper) != (lower, upper):
        raise AccountingError(
            f"{who}'s batch covers [{batch.lower}, {batch.upper}), not [{lower}, {upper})"
        )
    rows = sum(p.rows for p in batch.parts)
    if rows != batch.rows:
        raise AccountingError(f"{who}'s batch says {batch.rows} rows, its parts hold {rows}")


def batches_of(reports: Iterable[Report]) -> list[Batch]:
    """Every batch the reports carry (to delete their blobs when the attempt
    is abandoned: none of them was appended)."""
    out = []
    for r in reports:
        if r.own is not None:
            out.append(r.own)
        if r.received is not None:
            out.append(r.received.batch)
    return out


def parts_by_host(
    reports: Iterable[Report], host_of: Callable[[int], int], coalesced: bool
) -> dict[int, int]:
    """The parts of an attempt's batches by the host that built them: a
    worker's own batch on its group's host (``host_of(group)``), a shared
    batch on its group's host or, ``coalesced`` per host, on the host of the
    host builder that built it."""
    out: dict[int, int] = {}
    for report in reports:
        if report.own is not None:
            host = host_of(report.group)
            out[host] = out.get(host, 0) + len(report.own.parts)
        if report.received is not None:
            shared = report.received
            host = shared.host if coalesced else host_of(shared.group)
            out[host] = out.get(host, 0) + len(shared.batch.parts)
    return out
