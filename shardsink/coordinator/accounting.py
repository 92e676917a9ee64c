"""The append operator's check: do the workers' reports add up?

An interval is appended only if every worker of the cluster reported on the
same attempt without an error, every report's rows are in exactly one batch,
every shared contribution is in exactly one shared batch that some worker
received (whose contributor list matches the contributions exactly), and the
rows of all batches equal the rows all workers reported. Anything else
rejects the attempt: no append, so no interval is ever sealed with missing or
doubled data. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from ..persist.state import Batch
from ..protocol import Report, SharedBatch


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
) -> Accepted:
    """Check the reports of attempt ``attempt`` of ``interval`` (``[lower,
    upper)``), keyed by (group, worker); return what to append or raise
    :class:`AccountingError`."""
    missing = [f"g{g}/w{w}" for g in range(groups) for w in range(workers) if (g, w) not in reports]
    if missing:
        raise AccountingError(f"no report from {', '.join(missing)}")
    claimed: dict[tuple[int, int], dict[int, int]] = {}
    received: dict[tuple[int, int], SharedBatch] = {}
    batches: list[Batch] = []
    reported_rows = 0
    blob_puts = blob_put_bytes = own_batches = segment_parts = 0
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
            key = (r.received.group, r.received.generation)
            if r.received.group != g:
                raise AccountingError(f"{who} received a shared batch of group {key[0]}")
            if key in received:
                raise AccountingError(f"shared batch {key} was received twice")
            received[key] = r.received
        blob_puts += r.blob_puts
        blob_put_bytes += r.blob_put_bytes
    shared_batches: dict[int, int] = {}
    for key in sorted(claimed.keys() | received.keys()):
        shared = received.get(key)
        contributions = claimed.get(key, {})
        if shared is None:
            raise AccountingError(
                f"shared batch {key} holds rows of {sorted(contributions)} but nobody received it"
            )
        if shared.contributors != contributions:
            raise AccountingError(
                f"shared batch {key} lists contributors {shared.contributors}, the reports "
                f"{contributions}"
            )
        if shared.batch.rows != sum(contributions.values()):
            raise AccountingError(
                f"shared batch {key} holds {shared.batch.rows} rows, its contributors "
                f"{sum(contributions.values())}"
            )
        _check_description(shared.batch, lower, upper, f"shared batch {key}")
        batches.append(shared.batch)
        shared_batches[key[0]] = shared_batches.get(key[0], 0) + 1
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
