"""Checking a shard's stored data against its state (``shardsink shard verify``).

A state version describes every part it references: a blob part's key, its
length, row count and key and time bounds; an inline part's rows and
bounds. :func:`verify` reads every part of the live state (a blob part a
row group at a time, so memory stays at one row group) and every rollup the
state keeps, and reports each way the data differs from its description:
nothing is repaired, nothing is written but the reader lease it holds.

A batch with a digest (:mod:`~.digest`: what its interval's writers wrote)
is checked against what its parts hold: a changed value, a missing row or a
doubled one changes the sum of diffs or the hash, and the problem names the
batch's interval and its parts. Consolidation, compaction and ``since``
leave the digest as it was, so a compacted batch is checked too. A batch
without a digest (written with digests off, or compacted from one), or
with one of another hash scheme than its shard's, cannot be checked: it is
counted ``unverified``, never as verified.
"""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..storage import Blob
from . import parts as P
from .digest import Digest, comparable, digest
from .state import BlobPart, InlinePart, Part, ShardState, decode_state


class VerifyReport(msgspec.Struct, kw_only=True):
    """What :func:`verify` looked at, and every ``problem`` it found (each a
    line naming the part or rollup and what is wrong)."""

    shard: str
    seqno: int
    upper: int
    batches: int = 0
    blob_parts: int = 0
    inline_parts: int = 0
    rollups: int = 0
    rows: int = 0
    blob_bytes: int = 0
    digested: int = 0
    #: batches whose content could not be checked: no digest, or one of
    #: another hash scheme
    unverified: int = 0
    problems: list[str] = []

    @property
    def ok(self) -> bool:
        """No problem found (in what could be checked: see :attr:`verified`)."""
        return not self.problems

    @property
    def verified(self) -> bool:
        """No problem found, and every batch's content checked."""
        return self.ok and not self.unverified

    def summary(self) -> str:
        """One line: what was verified, and how many problems there are."""
        if not self.ok:
            found = f"{len(self.problems)} problems"
        elif self.unverified:
            found = (
                f"no problems, but {self.unverified} batches have no digest to check their "
                "content against: not verified"
            )
        else:
            found = "all verified"
        return (
            f"shard {self.shard!r} at seqno {self.seqno}, upper {self.upper}: {self.batches} "
            f"batches, {self.blob_parts} blob parts ({self.blob_bytes} bytes), "
            f"{self.inline_parts} inline parts, {self.rows} rows, {self.rollups} rollups, "
            f"{self.digested} batches checked against their digests: {found}"
        )


class _Seen(msgspec.Struct):
    """What a part's data holds: rows and bounds (``None`` for no rows)."""

    rows: int = 0
    ts_lo: int | None = None
    ts_hi: int | None = None
    key_lo: object = None
    key_hi: object = None
    digest: Digest | None = Digest()

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self.digest is not None:
            self.digest = self.digest + digest(table)
        self.rows += table.num_rows
        ts_lo, ts_hi = (s.as_py() for s in pc.min_max(table["ts"]).values())
        self.ts_lo = ts_lo if self.ts_lo is None else min(self.ts_lo, ts_lo)
        self.ts_hi = ts_hi if self.ts_hi is None else max(self.ts_hi, ts_hi)
        try:
            key_lo, key_hi = (s.as_py() for s in pc.min_max(table["key"]).values())
        except pa.ArrowNotImplementedError:
            return  # no bounds recorded for such keys either
        self.key_lo = key_lo if self.key_lo is None else min(self.key_lo, key_lo)
        self.key_hi = key_hi if self.key_hi is None else max(self.key_hi, key_hi)


def verify(state: ShardState, blob: Blob) -> VerifyReport:
    """Check every part of ``state``'s batches and every rollup it keeps
    against ``blob``: each blob part exists with its recorded length and
    decodes as the shard's schema with its recorded row count and bounds;
    each inline part decodes likewise; each batch's row count is its parts';
    each rollup decodes as the state of its version. A storage error of a
    ``stat`` or ``get`` is raised (the check did not happen); everything else
    is a problem in the report."""
    schema = P.schema_from_bytes(state.schema)
    report = VerifyReport(shard=state.shard, seqno=state.seqno, upper=state.upper)
    for batch in state.ordered_batches():
        report.batches += 1
        report.rows += batch.rows
        if sum(p.rows for p in batch.parts) != batch.rows:
            report.problems.append(
                f"batch {batch.id} [{batch.lower}, {batch.upper}) says {batch.rows} rows, "
                f"its parts {sum(p.rows for p in batch.parts)}"
            )
        held: Digest | None = Digest()
        for part in batch.parts:
            if isinstance(part, BlobPart):
                report.blob_parts += 1
                report.blob_bytes += part.encoded_bytes
                problem, seen = _blob_part(blob, part, schema)
            else:
                report.inline_parts += 1
                problem, seen = _inline_part(part, schema)
            if problem is not None:
                report.problems.append(f"{P.describe(part)} of batch {batch.id}: {problem}")
            held = None if held is None or seen.digest is None else held + seen.digest
        if batch.digest is None or not comparable(batch.digest, schema):
            report.unverified += 1
        elif held is not None:  # an unreadable part is a problem of its own
            report.digested += 1
            if not held.same_content(batch.digest):
                report.problems.append(_digest_problem(batch, held))
    for seqno, rollup in sorted(state.rollups.items()):
        report.rollups += 1
        problem = _rollup(blob, state.shard, seqno, rollup.key)
        if problem is not None:
            report.problems.append(f"rollup {rollup.key} of version {seqno}: {problem}")
    return report


def _digest_problem(batch, held: Digest) -> str:
    """The line for ``batch`` whose parts hold ``held``, not its digest."""
    assert batch.digest is not None
    return (
        f"interval [{batch.lower}, {batch.upper}) (batch {batch.id}, "
        f"{len(batch.parts)} parts: {', '.join(P.describe(p) for p in batch.parts)}) holds "
        f"{held.describe()}; its writers wrote {batch.digest.describe()}"
        f"{_diff_sum(held, batch.digest)}"
    )


def _diff_sum(held: Digest, written: Digest) -> str:
    if held.diffs == written.diffs:
        return " (same diffs, different content: a value changed)"
    return f" ({held.diffs - written.diffs:+d} diffs)"


#: A part that could not be read holds no digest to compare.
_UNREAD = _Seen(digest=None)


def _blob_part(blob: Blob, part: BlobPart, schema: pa.Schema) -> tuple[str | None, _Seen]:
    meta = blob.stat(part.key)
    if meta is None:
        return f"missing from blob {blob.uri}", _UNREAD
    if meta.size != part.encoded_bytes:
        return f"holds {meta.size} bytes, the state says {part.encoded_bytes}", _UNREAD
    source = blob.open_input(part.key)
    if source is None:
        return f"missing from blob {blob.uri}", _UNREAD
    seen = _Seen()
    try:
        with source:
            file = pq.ParquetFile(source)
            if not file.schema_arrow.equals(schema):
                return f"has schema {file.schema_arrow}, the shard {schema}", _UNREAD
            for group in range(file.num_row_groups):
                seen.add(file.read_row_group(group))
    except (pa.ArrowException, OSError) as exc:  # pyarrow raises both for a corrupt file
        return f"does not read as Parquet: {exc}", _UNREAD
    return _compare(part, seen), seen


def _inline_part(part: InlinePart, schema: pa.Schema) -> tuple[str | None, _Seen]:
    try:
        table = P.decode_inline(part, schema)
    except ValueError as exc:
        return f"does not decode: {exc}", _UNREAD
    seen = _Seen()
    seen.add(table)
    return _compare(part, seen), seen


def _compare(part: Part, seen: _Seen) -> str | None:
    """What differs between ``part``'s description and its data, if anything."""
    differ = [
        f"{name} {getattr(part, name)!r} recorded, {getattr(seen, name)!r} in its data"
        for name in ("rows", "ts_lo", "ts_hi")
        if getattr(part, name) != getattr(seen, name)
    ]
    differ += [
        f"{name} {getattr(part, name)!r} recorded, {getattr(seen, name)!r} in its data"
        for name in ("key_lo", "key_hi")
        if getattr(part, name) is not None and getattr(part, name) != getattr(seen, name)
    ]
    return "; ".join(differ) or None


def _rollup(blob: Blob, shard: str, seqno: int, key: str) -> str | None:
    data = blob.get(key)
    if data is None:
        return f"missing from blob {blob.uri}"
    try:
        state = decode_state(data)
    except msgspec.DecodeError as exc:
        return f"does not decode as a state: {exc}"
    if (state.shard, state.seqno) != (shard, seqno):
        return f"holds shard {state.shard!r} version {state.seqno}"
    return None
