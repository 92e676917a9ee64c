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
doubled data. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from ..persist.state import Batch
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
) -> Accepted:
    """Check the reports of attempt ``attempt`` of ``interval`` (``[lower,
    upper)``), keyed by (group, worker); return what to append or raise
    :class:`AccountingError`. ``host``: the shared batches were coalesced by
    a host builder (``coalesce`` host), so every group generation must be in
    exactly one host batch that exactly one worker received."""
    missing = [f"g{g}/w{w}" for g in range(groups) for w in range(workers) if (g, w) not in reports]
    if missing:
        raise AccountingError(f"no report from {', '.join(missing)}")
    claimed: dict[tuple[int, int], dict[int, int]] = {}
    received: dict[tuple[int, int], SharedBatch] = {}
    delivered: dict[tuple[int, int], GroupShare] = {}
    batches: list[Batch] = []
    reported_rows = 0
    blob_puts = blob_put_bytes = own_batches = 0
    for (g, w), r in sorted(reports.items()):
        who = f"g{g}/w{w}"
        if (r.interval, r.attempt, r.group, r.worker) != (interval, attempt, g, w):
            raise AccountingError(
                f"report filed as {who} of attempt {attempt} of interval {interval} is "
                f"g{r.group}/w{r.worker} of attempt {r.attempt} of interval {r.interval}"
            )
        if r.error is not None:
            raise AccountingError(f"{who} failed: {r.error}")
        reported_rows += r.rows
        own_rows = r.own.rows if r.own is not None else 0
        shared_rows = r.shared.rows if r.shared is not None else 0
        if own_rows + shared_rows != r.rows:
            raise AccountingError(
                f"{who} reports {r.rows} rows but {own_rows} in its own batch and "
                f"{shared_rows} shared"
            )
        if r.own is not None:
            _check_description(r.own, lower, upper, who)
            batches.append(r.own)
            own_batches += 1
        if r.shared is not None and r.shared.rows:
            claimed.setdefault((g, r.shared.generation), {})[w] = r.shared.rows
        if r.received is not None:
            # a group's batch is keyed by its generation; a host batch by the host's
            key = (0 if host else r.received.group, r.received.generation)
            if r.received.group != g:
                raise AccountingError(f"{who} received a shared batch of group {r.received.group}")
            if key in received:
                raise AccountingError(f"{_name(key, host)} was received twice")
            received[key] = r.received
        if r.delivered is not None:
            if not host:
                raise AccountingError(f"{who} reports a group generation passed to a host builder")
            share = r.delivered
            if share.group != g:
                raise AccountingError(f"{who} delivered a generation of group {share.group}")
            key = (g, share.generation)
            if key in delivered:
                raise AccountingError(f"group generation {key} was delivered twice")
            delivered[key] = share
        blob_puts += r.blob_puts
        blob_put_bytes += r.blob_put_bytes
    segment_parts = 0
    if host:
        claimed, segment_parts = _host_level(claimed, delivered)
    shared_batches: dict[int, int] = {}
    for key in sorted(claimed.keys() | received.keys()):
        shared = received.get(key)
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
        batches.append(shared.batch)
        shared_batches[shared.group] = shared_batches.get(shared.group, 0) + 1
        blob_puts += shared.blob_puts
        blob_put_bytes += shared.blob_put_bytes
        segment_parts += shared.segment_parts
    batch_rows = sum(b.rows for b in batches)
    if batch_rows != reported_rows:
        raise AccountingError(f"the batches hold {batch_rows} rows, the reports {reported_rows}")
    return Accepted(
        batches=tuple(batches),
        rows=batch_rows,
        own_batches=own_batches,
        shared_batches=shared_batches,
        blob_puts=blob_puts,
        blob_put_bytes=blob_put_bytes,
        segment_parts=segment_parts,
    )


def _host_level(
    claimed: dict[tuple[int, int], dict[int, int]], delivered: dict[tuple[int, int], GroupShare]
) -> tuple[dict[tuple[int, int], dict[int, int]], int]:
    """Every group generation's contributions matched against the generation
    its last finisher delivered; returns what the host batches must hold,
    keyed as received host batches are (``(0, host generation)`` ->
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
            host = at_host.setdefault((0, share.host_generation), {})
            host[key[0]] = host.get(key[0], 0) + rows
    return at_host, segment_parts


def _name(key: tuple[int, int], host: bool) -> str:
    return f"host batch {key[1]}" if host else f"shared batch {key}"


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
