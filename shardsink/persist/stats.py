"""Counters of a shard handle (this process's work), as msgspec Structs."""

from __future__ import annotations

import msgspec


class MachineStats(msgspec.Struct, kw_only=True):
    """State-storage work of one shard machine.

    - ``cas_calls`` / ``cas_mismatches``: consensus compare-and-set calls and
      how many lost to a concurrent version.
    - ``versions``: versions this machine committed; ``diff_bytes``: their
      encoded diff bytes (what consensus stored); ``last_diff_bytes``: the
      most recent one.
    - ``rollup_puts`` / ``rollup_bytes``: rollups written to blob.
    - ``rebuilds``: times state was rebuilt from a rollup.
    - ``indeterminate``: storage calls whose outcome was unknown.
    """

    cas_calls: int = 0
    cas_mismatches: int = 0
    versions: int = 0
    diff_bytes: int = 0
    last_diff_bytes: int = 0
    rollup_puts: int = 0
    rollup_bytes: int = 0
    rebuilds: int = 0
    indeterminate: int = 0

    def __sub__(self, before: MachineStats) -> MachineStats:
        """The work done between snapshot ``before`` and this one (its
        ``last_diff_bytes`` is this one's)."""
        now, then = msgspec.structs.asdict(self), msgspec.structs.asdict(before)
        work = {name: now[name] - then[name] for name in MACHINE_FIELDS}
        return MachineStats(**{**work, "last_diff_bytes": self.last_diff_bytes})


class ShardStats(MachineStats, kw_only=True):
    """Everything a shard handle counted: the :class:`MachineStats` fields plus
    its data-part work.

    - ``appends``: successful compare-and-appends; ``append_calls``: all of
      them, including mismatches; ``rows``: rows appended.
    - ``blob_puts`` / ``blob_put_bytes``: data parts written to blob (rollups
      are counted apart, in ``rollup_puts`` / ``rollup_bytes``).
    - ``data_parts`` / ``inline_parts`` / ``inline_bytes``: parts in batches
      this handle appended (blob parts, inline parts and their bytes).
    - ``part_refetches``: reads restarted from refreshed state after a part
      was found missing.
    - ``compactions`` / ``gc_runs`` / ``blobs_deleted``: maintenance done.
    """

    appends: int = 0
    append_calls: int = 0
    rows: int = 0
    blob_puts: int = 0
    blob_put_bytes: int = 0
    data_parts: int = 0
    inline_parts: int = 0
    inline_bytes: int = 0
    part_refetches: int = 0
    compactions: int = 0
    gc_runs: int = 0
    blobs_deleted: int = 0


#: The counters of :class:`MachineStats`.
MACHINE_FIELDS = MachineStats.__struct_fields__
