"""A group builder's channel to the host builder (``coalesce`` host).

With ``coalesce`` host, a group builder does not write its shared batches: it
is a worker of the host builder. It holds a :class:`~shardsink.shm.PartSender`
into the host builder's part channel (routing id
:func:`~shardsink.protocol.worker_identity` of its group index, its own
shared-memory arena) and a DEALER on the host builder's handoff socket, as a
worker holds both into its group builder. Per batch id it joins the host
batch (best-effort: with an empty part as soon as a worker of the group joins,
so the groups that work at the same time share one host batch), passes each
finished generation on as parts, the group's last generation of the id with
``last=1`` on its last part (an empty one if it has no rows, so the host
batch can be handed off), and takes the host builder's
:class:`~shardsink.protocol.Handoff` to that finish. With a workload of
several shards all of that is per shard (each part says its shard, each
answer too), over one channel.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa
import zmq

from .. import faults, protocol
from ..shm import PartSender
from .shared_batch import BatchId, Description


class HostLink:
    """The host-builder side of group ``spec.group``'s builder (see the module
    doc), whose rows of shard ``i`` have the shard schema ``schemas[i]``.
    :meth:`connect` before use; :meth:`close` is idempotent."""

    def __init__(
        self, spec: protocol.ChildSpec, ctx: zmq.Context, schemas: Sequence[pa.Schema]
    ) -> None:
        if not spec.host_parts or not spec.host_handoff:
            raise ValueError("coalesce host needs the host builder's part and handoff sockets")
        self.spec = spec
        self.schemas = list(schemas)
        self.group = spec.group
        self.identity = protocol.worker_identity(spec.group)
        self.socket = ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, self.identity)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.sender: PartSender | None = None
        # by (shard, batch id)
        self._descriptions: dict[tuple[int, BatchId], Description] = {}
        self._open: set[tuple[int, BatchId]] = set()

    def connect(self, timeout_s: float) -> None:
        """Connect both sockets and wait for the host builder's welcome;
        ``TimeoutError`` after ``timeout_s``."""
        config = self.spec.config
        self.socket.connect(self.spec.host_handoff)
        self.sender = PartSender(
            self.spec.host_parts,
            self.spec.cluster_id,
            message_part_max_bytes=config.message_part_max_bytes,
            timeout=config.interval_timeout_s,
            identity=self.identity,
        )
        self.socket.send(protocol.encode(protocol.HandoffHello(self.group)))
        if not self.socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(
                f"the host builder did not welcome group {self.group} within {timeout_s}s"
            )
        if not isinstance(protocol.decode_handoff(self.socket.recv()), protocol.Welcome):
            raise ValueError("the host builder answered the hello with something else")

    def join(self, bid: BatchId, description: Description, shard: int) -> None:
        """A worker of the group joined ``bid`` of ``shard``: in best-effort,
        join the host batch unless this group's handle on it is open already."""
        key = (shard, bid)
        self._descriptions.setdefault(key, description)
        if description.barrier or key in self._open:
            return
        self._open.add(key)
        self._send(key, protocol.empty_part(self.schemas[shard]), last=False)

    def forward(
        self, bid: BatchId, batches: list[pa.RecordBatch], *, finish: bool, shard: int
    ) -> None:
        """Pass a finished generation of ``bid`` of ``shard`` (its rows:
        ``batches``) to the host builder; with ``finish`` (the group is done
        with ``bid``) finish this group's handle, whose answer comes from
        :meth:`answers`. Blocks while the arena is full (up to the interval
        timeout, then ``TransportTimeout``)."""
        faults.point("builder.before_forward")
        # one part per protocol.PART_BYTES, not one per worker part held
        table = pa.Table.from_batches(batches, schema=self.schemas[shard]).combine_chunks()
        if not finish and not table.num_rows:
            return
        key = (shard, bid)
        *pieces, final = protocol.parts_of(table)
        for piece in pieces:
            self._send(key, piece, last=False)
        self._send(key, final, last=finish)
        if finish:
            self._open.discard(key)

    def answers(self) -> list[protocol.Handoff]:
        """The host builder's answers received so far (without waiting)."""
        what = f"group {self.group}'s host builder"
        answers = protocol.queued(self.socket, protocol.decode_handoff, what)
        return [a for a in answers if isinstance(a, protocol.Handoff)]

    def forget(self, bids: Iterable[BatchId], shard: int) -> None:
        """Drop what is kept of ``bids`` of ``shard`` (done or abandoned)."""
        for bid in bids:
            self._descriptions.pop((shard, bid), None)
            self._open.discard((shard, bid))

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        self.socket.close()

    def _send(self, key: tuple[int, BatchId], batch: pa.RecordBatch, *, last: bool) -> None:
        assert self.sender is not None
        shard, bid = key
        d = self._descriptions.get(key)
        if d is None:  # its id was swept or abandoned before its last finish was decided
            raise ValueError(f"batch id {bid} is no longer known to group {self.group}'s link")
        meta = protocol.Contribute(
            interval=bid[0],
            attempt=bid[1],
            lower=d.lower,
            upper=d.upper,
            barrier=int(d.barrier),
            worker=self.group,
            rows=batch.num_rows,
            last=int(last),
            writer=d.writer,
            shard=shard,
        )
        self.sender.send(batch, protocol.contribute_meta(meta))
