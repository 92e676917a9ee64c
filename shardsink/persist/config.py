"""Knobs of a shard handle, as one msgspec Struct."""

from __future__ import annotations

import msgspec

from .._bounds import at_least, positive
from .._units import MIB

#: How often a consensus server's maintenance looks for the spine's merges. A look that finds none
#: costs one state refresh; a cluster appending as fast as it can adds tens
#: of batches a second (one per append), so looking often keeps each merge
#: small and the batches in state near the bound.
COMPACT_INTERVAL_S = 0.1
#: How many batches a pass of the spine's merges must remove before a
#: consensus server starts one (see ``spine.pass_due``): about one blob part
#: per this many small batches, and at most this many batches above the
#: spine's bound. An append is one batch. Passes wait for the slack in each
#: lane (the 64 MiB lane's carry, then the 4 MiB lane beside it), so a
#: 20,000-interval 4x8 soak on a loaded machine peaked at 68 batches with 16;
#: 8 keeps it near 0.11 compaction PUTs per append.
COMPACT_SLACK = 8
#: The encoded bytes at which a consensus server's compaction cuts an output
#: part (at most ``blob_target_bytes``). A merge holds its output part's
#: encoding until it is stored, so this bounds a pass's memory: a
#: 20,000-interval soak's consensus process peaked at 393 MiB in its largest
#: merge's block with parts cut at 128 MiB of Arrow data, against 132 MiB
#: early on. 4 MiB is also the small merge lane's cap: a full-size merge then
#: holds about what the early, small ones do. Merging 2M rows of 8 overlapping
#: parts in 32Ki-row windows (``compaction.WINDOW_ROWS``) into 4 MiB parts with
#: the consensus server's allocators (``shardsink._allocator``) peaked 73 MiB
#: above the process (``shardsink bench allocators``).
COMPACT_PART_BYTES = 4 * 1024 * 1024


class ShardConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Limits and timings of one shard handle; every field has a sane default.

    ``inline_max_bytes`` and ``inline_total_max_bytes`` are fixed into the
    shard's state by whoever creates it; later openers use the state's values.
    The fields of :data:`SERVED_FIELDS` belong to the shard's one machine
    where a consensus server holds it: there they are the server's (its
    flags), and a handle asking for others is refused, not overruled. The
    other fields apply to the handle that carries them.

    - ``rollup_threshold``: a full state rollup goes to blob every this many versions.
    - ``inline_max_bytes``: a part whose encoding is below this many bytes is
      stored inline in state instead of in blob.
    - ``inline_total_max_bytes``: cap on all inline bytes of the shard; at the
      cap a writer flushes its inline parts to blob and retries.
    - ``blob_target_bytes``: target size of a data part (writers split above it,
      compaction merges up to it).
    - ``reader_lease_ms``: a reader not heartbeated for this long stops holding
      its seqno and may be expired.
    - ``writer_lease_ms``: a writer neither appending nor heartbeating for
      this long is removed from state by maintenance (a crashed coordinator's
      writer goes); a live writer heartbeats every third of it. Where a
      consensus server holds the shard, its lease (``--writer-lease-ms``)
      replaces the handle's in the machine's ``config`` (read it there): the
      server expires writers, whatever lease a client asked for.
    - ``retain``: how far ``since`` trails the upper, in the shard's time
      unit (default one hour of ``up``'s millisecond timestamps); a consensus
      server's maintenance advances since by it (``--retain``), held back by
      live readers (see ``transitions.retention_since``); 0: since moves
      only when asked (``Shard.advance_since``).
    - ``leaked_blob_grace_ms``: the leaked-blob sweep only deletes unreferenced
      blobs older than this.
    - ``max_attempts``: how many lost compare-and-sets or failed storage calls
      a command survives before the last error (or ``Contended``) is raised.
    - ``server_timeout_s``: with a consensus server, how long one request waits
      for its reply (and how long opening waits for the server to answer).
    - ``server_retry_for_s``: how long a request that timed out keeps being
      retried (every request is idempotent) before ``IndeterminateError``.
    """

    rollup_threshold: int = 128
    inline_max_bytes: int = 4096
    inline_total_max_bytes: int = MIB
    blob_target_bytes: int = 128 * MIB
    reader_lease_ms: int = 15 * 60 * 1000
    writer_lease_ms: int = 15 * 60 * 1000
    retain: int = 60 * 60 * 1000
    leaked_blob_grace_ms: int = 60 * 60 * 1000
    max_attempts: int = 64
    server_timeout_s: float = 5.0
    server_retry_for_s: float = 60.0

    def __post_init__(self) -> None:
        where = "ShardConfig."
        at_least(
            self,
            1,
            "rollup_threshold",
            "blob_target_bytes",
            "reader_lease_ms",
            "writer_lease_ms",
            "max_attempts",
            prefix=where,
        )
        positive(self, "server_timeout_s", prefix=where)
        at_least(
            self,
            0,
            "inline_max_bytes",
            "inline_total_max_bytes",
            "leaked_blob_grace_ms",
            "retain",
            "server_retry_for_s",
            prefix=where,
        )


#: For a shard none of whose writers' processes is alive any more (a check
#: after a run ended): a lease and a grace of a millisecond let GC expire
#: every writer and the sweep take everything leaked at once. Only then: a
#: live writer's parts in flight would be taken too.
OFFLINE = ShardConfig(writer_lease_ms=1, leaked_blob_grace_ms=1)


#: The fields a consensus server applies to every shard it serves, for every
#: client alike: its own settings, never one client's.
SERVED_FIELDS = ("rollup_threshold", "leaked_blob_grace_ms", "max_attempts")


def check_served(asked: ShardConfig, served: ShardConfig, where: str) -> None:
    """``ValueError`` naming, for each of :data:`SERVED_FIELDS` where
    ``asked`` differs from ``served``, both values and the server flag that
    sets it; ``where`` says whose request it was (e.g. the shard). A field
    left at its default asks for nothing (a plain ``shardsink read`` takes the
    server's values): it cannot be told from one set on purpose, and refusing
    every default client of a server with other values helps nobody."""
    default = ShardConfig()
    differ = [
        name
        for name in SERVED_FIELDS
        if getattr(asked, name) not in (getattr(served, name), getattr(default, name))
    ]
    if differ:
        raise ValueError(
            f"{where}: asked for "
            + ", ".join(f"{name}={getattr(asked, name)}" for name in differ)
            + ", but this consensus server runs every shard with "
            + ", ".join(
                f"{name}={getattr(served, name)} (--{name.replace('_', '-')})" for name in differ
            )
            + "; open with the server's values, or restart the server with yours"
        )
