"""Every message of a cluster, as msgspec Structs decoded strictly.

Channels (all ZeroMQ over ``ipc://`` sockets in the cluster's 0700 run
directory, plus the shared-memory part channel of ``shardsink.shm``):

- coordinator ROUTER <-> one DEALER per builder and worker (routing id
  ``g<G>/b`` or ``g<G>/w<W>``): :data:`ToChild` one way, :data:`FromChild`
  the other.
- worker -> builder: parts through ``shardsink.shm`` (routing id ``w<W>``,
  :func:`worker_identity`); each part's metadata is a :class:`Contribute`
  (``msgspec.structs.asdict`` / :func:`decode_contribute`), so parts and the
  finish that follows them travel in one ordered stream.
- builder ROUTER <-> worker DEALER (routing id ``w<W>``): :class:`HandoffHello`
  from the worker once, :class:`Handoff` to every finisher.
- coordinator -> child at launch: a :class:`ChildSpec` as JSON on stdin.
- with ``coalesce`` host, group builder -> host builder (routing id
  ``host`` on the coordinator's socket): each group builder is a worker of
  the host builder, routing id :func:`worker_identity` of its group index, on
  the host builder's part channel and handoff socket, with the same
  :class:`Contribute`, :class:`HandoffHello` and :class:`Handoff` messages.

Per interval and worker: one :class:`Mint`; unless the mode is ``off``, per
shard of the workload, an empty part that joins the shared batch
(best-effort only), the worker's parts (the last one carries ``last=1``; a
worker that shares nothing sends an empty one) and one :class:`Handoff`
back; then one :class:`Report` per shard. Tagged unions
are decoded with unknown fields and tags rejected; nothing is ever unpickled
or evaluated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Annotated, Literal, TypeVar

import msgspec
import pyarrow as pa
import zmq

from ._curve import ClientKeys, secure_client
from ._wire import Message
from .config import ClusterConfig, Mode
from .persist import Batch, Digest, parts as P

log = logging.getLogger(__name__)
T = TypeVar("T")
Count = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]
Flag = Annotated[int, msgspec.Meta(ge=0, le=1)]
Role = Literal["builder", "worker"]


# --- coordinator <-> builders and workers ---------------------------------------


class Hello(Message, tag="hello"):
    """A child is up and connected (a builder: its part and handoff sockets are bound)."""

    role: Role
    group: Count
    index: Count
    pid: Count


class Members(Message, tag="members"):
    """To a builder: the pids of its group's workers, the only creators of
    shared-memory segments it will read."""

    worker_pids: tuple[Count, ...]


class Mint(Message, tag="mint"):
    """To a worker: write interval ``interval`` (times ``[lower, upper)``) as
    attempt ``attempt``, in ``mode`` with threshold ``shared_max_bytes``, the
    blob parts of each shard (its own and its builder's) as the
    coordinator's writer of that shard, ``writers[shard]`` (under its
    prefix: only that writer may append them). Shards are numbered in the
    workload's order (:func:`shardsink.workloads.shard_schemas`); a workload
    of one ``schema`` has one."""

    interval: Count
    attempt: Count
    lower: Count
    upper: Count
    mode: Mode
    shared_max_bytes: Count
    writers: tuple[str, ...]


class Abandon(Message, tag="abandon"):
    """Attempt ``attempt`` of ``interval`` will not be appended: stop waiting
    for it (a worker) or abort its shared batches (a builder)."""

    interval: Count
    attempt: Count


class Shutdown(Message, tag="shutdown"):
    """Close everything and exit 0."""


class SharedBatch(Message):
    """A finished shared batch as the builder hands it to the last finisher:
    ``contributors`` maps each worker (index in the group) to the rows it
    added; ``blob_puts``/``blob_put_bytes`` are the builder's writes for it;
    ``segment_parts`` counts the parts with rows that reached the builder
    through a shared-memory segment (the others came inline in the message).
    ``lag_s``: the builder's lag, from taking the last finisher's finishing
    part to handing the batch off (writing what it still held, and any
    linger), for the ``auto`` threshold. A host batch (``coalesce`` host)
    is ``host``'s: the index of the host builder that built it (its
    contributors are groups)."""

    group: Count
    generation: Count
    batch: Batch
    contributors: dict[Count, Count]
    blob_puts: Count
    blob_put_bytes: Count
    segment_parts: Count = 0
    lag_s: Seconds = 0.0
    host: Count = 0


class GroupShare(Message):
    """``coalesce`` host: generation ``generation`` of ``group``'s shared
    batch, whose rows (``contributors``: worker index in the group -> rows)
    its builder passed to the host builder, in host batch generation
    ``host_generation``; ``segment_parts`` counts its parts with rows that
    reached the group builder through a shared-memory segment; ``host``: the
    index of that host builder. Reported by the generation's last finisher,
    whether or not it received the host batch."""

    group: Count
    generation: Count
    contributors: dict[Count, Count]
    host_generation: Count
    segment_parts: Count = 0
    host: Count = 0


class Contribution(Message):
    """Rows a worker added to shared batch generation ``generation`` of its group."""

    generation: Count
    rows: Count


class Report(Message, tag="report"):
    """A worker's account of one attempt of one interval, of one shard
    (``shard``, numbered as in :class:`Mint`): a worker files one report
    per shard, each about the rows, batches and digest of that shard alone.

    ``rows``: all the rows it produced (its own batch's plus its shared
    contribution). ``own``: the batch it wrote itself, if any. ``shared``: what
    it added to a shared batch, if anything. ``received``: the shared batch it
    received as the last finisher, if it was (with ``coalesce`` host: the
    host batch, received by the last finisher of the group that finished last
    at the host builder). ``delivered``: with ``coalesce`` host, the group
    generation this worker finished last and its builder passed on to the host
    builder. ``blob_puts``/``blob_put_bytes``:
    its own writes. ``error``: why it could not do its part (then nothing of
    this report is appended). ``digest``: the digest of every update it
    produced (:mod:`shardsink.persist.digest`), which the batches appended
    for the interval must add up to.

    For the ``auto`` threshold (:mod:`shardsink.coordinator.threshold`):
    ``staged_bytes``, the Arrow bytes of its updates for the interval, and
    ``write_s``, how long writing its own batch took (0 without one).
    """

    interval: Count
    attempt: Count
    group: Count
    worker: Count
    rows: Count
    shard: Count = 0
    own: Batch | None = None
    shared: Contribution | None = None
    received: SharedBatch | None = None
    delivered: GroupShare | None = None
    blob_puts: Count = 0
    blob_put_bytes: Count = 0
    error: str | None = None
    staged_bytes: Count = 0
    write_s: Seconds = 0.0
    digest: Digest | None = None


class Failure(Message, tag="failure"):
    """Child ``pid`` hit an error it cannot continue from; it exits after sending this."""

    pid: Count
    reason: str


ToChild = Members | Mint | Abandon | Shutdown
FromChild = Hello | Report | Failure


# --- worker -> builder (part metadata) --------------------------------------------


class Contribute(Message):
    """The metadata of every part a worker sends its builder.

    The part's rows (``rows``, possibly 0) of shard ``shard`` (numbered as
    in :class:`Mint`) go to that shard's shared batch of batch id
    ``(interval, attempt)`` describing ``[lower, upper)`` (``barrier`` 1: a
    barrier batch) written as ``writer`` (the mint's writer of the shard);
    the first part of a worker joins, the one with ``last=1`` finishes its
    handle. Each shard's batches are built apart, each worker holding one
    handle per shard. ``worker`` is the sender's own index: the builder
    refuses a part whose ``worker`` is not the one its socket's routing id
    (:func:`worker_identity`) names.
    """

    interval: Count
    attempt: Count
    lower: Count
    upper: Count
    barrier: Flag
    worker: Count
    rows: Count
    last: Flag
    writer: str
    shard: Count = 0


#: A sender's rows are sent in parts of at most this many Arrow bytes, so the
#: builder can cut Parquet parts while the rest is still arriving.
PART_BYTES = 4 << 20


def empty_part(schema: pa.Schema) -> pa.RecordBatch:
    """The part of no rows of the shard ``schema``: a best-effort join, or the
    finish of a sender with nothing to share."""
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def parts_of(table: pa.Table) -> list[pa.RecordBatch]:
    """``table`` as the record batches a sender hands its builder: consecutive
    slices of about :data:`PART_BYTES`, at least one (empty for an empty table)."""
    pieces = [b for piece in P.split(table, PART_BYTES) for b in piece.to_batches()]
    return pieces or [empty_part(table.schema)]


# --- builder <-> worker -------------------------------------------------------------


class HandoffHello(Message, tag="handoff_hello"):
    """A worker's handoff socket is connected (sent once, at start)."""

    worker: Count


class Welcome(Message, tag="welcome"):
    """The builder's answer to :class:`HandoffHello`: handoffs can reach the worker."""


class Handoff(Message, tag="handoff"):
    """The answer to a finish of shard ``shard``'s handle: ``shared`` if this
    worker was the last finisher of ``generation``, else ``None``; ``error``
    if the builder could not take the contribution (then nothing was taken).
    With ``coalesce`` host, a group
    builder answers the last finisher of its generation with ``share`` (where
    the generation went) and, if its group finished last at the host builder,
    the host batch as ``shared``; the host builder answers group builders as a
    group builder answers workers."""

    interval: Count
    attempt: Count
    generation: Count
    shared: SharedBatch | None = None
    error: str | None = None
    share: GroupShare | None = None
    shard: Count = 0


# --- coordinator -> child at launch ------------------------------------------------


class CurveKeys(Message):
    """The CURVE keys (z85 text) a child connects to a ``tcp://``
    coordinator with: the coordinator's public key and the cluster's client
    key pair (:func:`shardsink._curve.ephemeral_keys`). Its ``repr`` hides
    the secret."""

    server: str
    public: str
    secret: str

    @classmethod
    def of(cls, keys: ClientKeys) -> CurveKeys:
        return cls(keys.server.decode(), keys.public.decode(), keys.secret.decode())

    def client_keys(self) -> ClientKeys:
        return ClientKeys(self.server.encode(), self.public.encode(), self.secret.encode())

    def __repr__(self) -> str:
        return f"CurveKeys(server={self.server!r}, public={self.public!r}, secret=***)"

    def __rich_repr__(self):
        yield "server", self.server
        yield "public", self.public
        yield "secret", "***"


class ChildSpec(Message):
    """Everything a builder or worker process needs to start (its role and
    parent come in its argv, as for every child). ``coordinator``/``parts``/
    ``handoff``: socket addresses.
    ``inline_max_bytes``: the shard's inline threshold. ``host_parts``/
    ``host_handoff``: the host builder's sockets, which a group builder
    connects to with ``coalesce`` host (empty otherwise).
    ``coordinator_keys``: the CURVE keys to connect to a ``tcp://``
    ``coordinator`` with (``None`` for ``ipc://``); secret, so the spec
    travels only as the launch payload, and its ``repr`` hides them.
    ``host``: the index of the host the child runs on, whose host builder a
    group builder sends to (``coalesce`` host); a host builder's
    ``host_groups`` are the groups that send to it (empty: every group).
    """

    group: Count
    index: Count
    cluster_id: str
    coordinator: str
    parts: str
    handoff: str
    inline_max_bytes: Count
    config: ClusterConfig
    host_parts: str = ""
    host_handoff: str = ""
    coordinator_keys: CurveKeys | None = None
    host: Count = 0
    host_groups: tuple[Count, ...] = ()

    def connect_coordinator(self, sock: zmq.Socket) -> None:
        """Connect ``sock`` to the coordinator, as a CURVE client with
        ``coordinator_keys`` if the spec has them."""
        if self.coordinator_keys is not None:
            secure_client(sock, self.coordinator_keys.client_keys())
        sock.connect(self.coordinator)


#: The roles of a cluster's children (:mod:`shardsink.process.roles` names,
#: so the coordinator starts them without importing them), each given its
#: :class:`ChildSpec` as its payload: a group's builder, the host builder
#: (``coalesce`` host) and a worker.
BUILDER_ROLE = "shardsink.builder.builder:main"
HOST_BUILDER_ROLE = "shardsink.builder.builder:host_main"
WORKER_ROLE = "shardsink.worker.worker:main"
#: What a cluster's zygote imports before it forks any child.
CHILD_ROLES = (BUILDER_ROLE, HOST_BUILDER_ROLE, WORKER_ROLE)


encode = msgspec.msgpack.Encoder().encode
decode_from_child = msgspec.msgpack.Decoder(FromChild).decode
decode_to_child = msgspec.msgpack.Decoder(ToChild).decode
decode_handoff = msgspec.msgpack.Decoder(Welcome | Handoff).decode
decode_handoff_hello = msgspec.msgpack.Decoder(HandoffHello).decode
#: A child's launch payload, the one message in JSON (see the module doc).
encode_spec = msgspec.json.Encoder().encode
decode_spec = msgspec.json.Decoder(ChildSpec).decode


def queued(sock: zmq.Socket, decode: Callable[[bytes], T], what: str) -> Iterator[T]:
    """Every message queued on ``sock`` (without waiting), decoded with
    ``decode``; a malformed one is logged as from ``what`` and skipped."""
    while True:
        try:
            raw = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            yield decode(raw)
        except msgspec.DecodeError as exc:
            log.warning("malformed message from %s: %s", what, exc)


def host_builder_name(host: int) -> str:
    """The name and routing id of host ``host``'s host builder."""
    return "host" if host == 0 else f"host{host}"


def worker_identity(index: int) -> bytes:
    """The ZeroMQ routing id of worker ``index`` on its builder's part and
    handoff sockets."""
    return f"w{index}".encode()


def contribute_meta(contribute: Contribute) -> dict[str, int | str]:
    """``contribute`` as part metadata (see ``shardsink.shm``)."""
    return msgspec.structs.asdict(contribute)


def decode_contribute(meta: dict) -> Contribute:
    """A part's metadata as a :class:`Contribute`; ``msgspec.ValidationError``
    if it is not one (strict: no coercion, no unknown keys)."""
    return msgspec.convert(meta, Contribute, strict=True)
