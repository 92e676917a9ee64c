"""The client side of a consensus server: a shard machine over ZeroMQ.

:class:`RemoteMachine` implements :class:`~shardsink.persist.machine.ShardMachine`,
so a shard handle works unchanged against a server
(``open_shard(name, blob=..., consensus="tcp://127.0.0.1:PORT")``).

Every request is safe to repeat (shard commands are idempotent: an append
carries its writer's token), so a request that times out is simply sent again
until ``retry_for_s`` has passed: a server that restarts in the meantime
answers the retry from its durable store, and an append that had already been
applied answers as already appended instead of appending twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from .._curve import ClientKeys, keys_for
from ..persist import (
    AlreadyAppended,
    Appended,
    Command,
    CompactionReport,
    CompareAndAppend,
    GcReport,
    Leased,
    LeaseSeqno,
    MachineStats,
    RegisterReader,
    Result,
    ShardConfig,
    ShardState,
    WrongUpper,
)
from ..storage import DeterminateError, IndeterminateError, VersionedData
from . import history
from .rpc import RpcClient
from .wire import (
    ErrorReply,
    FetchState,
    GetStats,
    Maintain,
    MaintainedReply,
    OpenedReply,
    OpenShard,
    Ping,
    Pong,
    RunCommand,
    RunReply,
    RunTransaction,
    ScanVersions,
    ServerReply,
    ServerRequest,
    StateReply,
    StatsReply,
    TransactionItem,
    TransactionReply,
    VersionsReply,
    WaitForUpper,
    decode_reply,
    encode,
    error_class,
)

#: Longest single long poll; a longer wait is several polls.
_POLL_SLICE_S = 10.0
#: How much longer than a request a maintenance job may take to be answered
#: (a compaction by hand merges everything mergeable).
MAINTAIN_TIMEOUT_S = 600.0


class ServerClient:
    """Typed requests to one consensus server at ``address``.

    ``timeout_s`` bounds one attempt; a request is retried until ``retry_for_s``
    has passed, then the last ``IndeterminateError`` is raised. An error reply
    is raised as the exception its kind names. A ``tcp://`` server needs
    CURVE ``keys`` (default: :func:`~shardsink._curve.keys_for` the address;
    ``ValueError`` if there are none). ``close()`` is idempotent.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 5.0,
        retry_for_s: float = 60.0,
        keys: ClientKeys | None = None,
    ) -> None:
        self.address = address
        self.retry_for_s = retry_for_s
        self.retries = 0
        self._rpc = RpcClient(address, timeout_s, keys if keys is not None else keys_for(address))

    def request(
        self,
        request: ServerRequest,
        *,
        extra_timeout_s: float = 0.0,
        on_resend: Callable[[], None] | None = None,
    ) -> ServerReply:
        """Send ``request`` and return the server's reply; ``on_resend`` is
        called before each resend after an attempt timed out (the server may
        have run the earlier one: a history records each send)."""
        payload = encode(request)
        deadline = time.monotonic() + self.retry_for_s
        while True:
            try:
                raw = self._rpc.call(payload, self._rpc.timeout_s + extra_timeout_s)
                break
            except IndeterminateError:
                if time.monotonic() >= deadline:
                    raise
                self.retries += 1
                if on_resend is not None:
                    on_resend()
        try:
            reply = decode_reply(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise IndeterminateError(f"malformed reply from {self.address}: {exc}") from None
        if isinstance(reply, ErrorReply):
            raise error_class(reply.kind)(f"consensus server {self.address}: {reply.message}")
        return reply

    def ping(self, timeout_s: float) -> int:
        """The server's pid. Raises ``DeterminateError`` naming the address if
        nothing answers within ``timeout_s``."""
        try:
            reply = self._rpc.call(encode(Ping()), timeout_s)
        except IndeterminateError:
            raise DeterminateError(
                f"no consensus server answers at {self.address} (waited {timeout_s:.1f}s)"
            ) from None
        try:
            pong = decode_reply(reply)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pong = None
        if not isinstance(pong, Pong):
            raise DeterminateError(f"{self.address} is not a consensus server: {reply[:40]!r}")
        return pong.pid

    def stats(self) -> StatsReply:
        reply = self.request(GetStats())
        assert isinstance(reply, StatsReply)
        return reply

    def close(self) -> None:
        self._rpc.close()


class _History:
    """What this process's clients record of the consensus protocol, if a
    history file is named (:func:`.history.from_environment`): each
    compare-and-append as an ``append`` op and each state read (a fetch, a
    long poll, a reader's lease) as a ``read`` of the upper, invoked before
    the request is sent and completed with what came back.

    A request the client sends again after a timeout is one op per send
    (:meth:`calls`): the earlier send is ``info`` (the server may have run
    it, even after the resend), so a resend answered ``already`` is
    explained by it, as the checker requires."""

    def __init__(self) -> None:
        got = history.from_environment()
        self.writer, self.process = got if got is not None else (None, "")

    def calls(self, items: Sequence[tuple[str, Command | None]]) -> _Calls:
        """The ops of one request of ``items`` (shard, command; ``None``: a read)."""
        return _Calls(self, items)

    def invoke(self, shard: str, command: Command | None) -> history.Handle | None:
        if self.writer is None:
            return None
        if command is None:
            return self.writer.invoke(process=self.process, shard=shard, kind="read")
        if not isinstance(command, CompareAndAppend):
            return None
        return self.writer.invoke(
            process=self.process, shard=shard, kind="append", writer=command.writer_id,
            token=command.token, lower=command.expected_upper, upper=command.new_upper,
        )  # fmt: skip

    def done(self, handle: history.Handle | None, outcome: object) -> None:
        """Complete ``handle`` with a result, a state or the error raised."""
        if handle is None or self.writer is None:
            return
        if isinstance(outcome, Appended):
            self.writer.complete(handle, "ok")
        elif isinstance(outcome, AlreadyAppended):
            self.writer.complete(handle, "already")
        elif isinstance(outcome, WrongUpper):
            self.writer.complete(handle, "mismatch", actual=outcome.actual)
        elif isinstance(outcome, ShardState | Leased):
            state = outcome if isinstance(outcome, ShardState) else outcome.state
            self.writer.complete(handle, "ok", upper=state.upper)
        elif isinstance(outcome, DeterminateError):
            self.writer.complete(handle, "fail")
        elif isinstance(outcome, BaseException):  # a lost answer, a crash: it may have happened
            self.writer.complete(handle, "info")
        else:  # refused: WriterGone, PartsMissing, Rejected, InlineCapExceeded, ...
            self.writer.complete(handle, "fail")


class _Calls:
    """The ops of one request in flight (see :class:`_History`): one per
    item, invoked again at each resend, the earlier ones left ``info``."""

    def __init__(self, recorder: _History, items: Sequence[tuple[str, Command | None]]) -> None:
        self._recorder = recorder
        self._items = list(items)
        self._handles = [recorder.invoke(shard, command) for shard, command in self._items]

    def resent(self) -> None:
        for handle in self._handles:
            self._recorder.done(handle, IndeterminateError("sent again after a timeout"))
        self._handles = [self._recorder.invoke(shard, command) for shard, command in self._items]

    def done(self, outcomes: Sequence[object]) -> None:
        """Complete each op with its item's outcome (one for all: the error raised)."""
        for handle, outcome in zip(self._handles, outcomes, strict=False):
            self._recorder.done(handle, outcome)

    def failed(self, exc: BaseException) -> None:
        self.done([exc] * len(self._handles))


class RemoteTransactions:
    """:class:`~shardsink.persist.transactions.Transactions` run by the
    consensus server ``client`` reaches (its shards must be loaded there:
    opened through it)."""

    def __init__(self, client: ServerClient) -> None:
        self._client = client
        self._history = _History()

    def run_all(self, items) -> list[Result]:
        request = RunTransaction(tuple(TransactionItem(shard, command) for shard, command in items))
        calls = self._history.calls(items)
        try:
            reply = self._client.request(request, on_resend=calls.resent)
        except BaseException as exc:
            calls.failed(exc)
            raise
        calls.done(getattr(reply, "results", ()))
        if not isinstance(reply, TransactionReply):
            raise IndeterminateError(
                f"consensus server {self._client.address} answered {type(reply).__name__}, "
                "expected TransactionReply"
            )
        return list(reply.results)


class RemoteMachine:
    """A :class:`~shardsink.persist.machine.ShardMachine` served by a consensus
    server, and the shard's :class:`~shardsink.persist.maintenance.Maintenance`
    (the server runs each job itself). ``stats()`` counts the state-storage
    work the server did for this handle's commands. Use :meth:`open`."""

    def __init__(self, client: ServerClient, shard: str, config: ShardConfig) -> None:
        self.shard = shard
        self.config = config
        self._client = client
        self._state: ShardState | None = None
        self._stats = MachineStats()
        self._closed = False
        self._history = _History()

    @classmethod
    def open(
        cls,
        address: str,
        shard: str,
        *,
        schema: bytes,
        config: ShardConfig,
        create: bool = True,
        timeout_s: float = 5.0,
        retry_for_s: float = 60.0,
        keys: ClientKeys | None = None,
    ) -> RemoteMachine:
        """Connect and load the shard (a ``tcp://`` server with CURVE ``keys``,
        as :class:`ServerClient`). Raises ``DeterminateError`` naming the
        address if no server answers within ``timeout_s``."""
        client = ServerClient(address, timeout_s=timeout_s, retry_for_s=retry_for_s, keys=keys)
        try:
            client.ping(timeout_s)
            machine = cls(client, shard, config)
            reply = machine._expect(
                client.request(OpenShard(shard, schema, config, create)), OpenedReply
            )
            # the server expires writers, so its lease is the one to heartbeat by
            machine.config = msgspec.structs.replace(config, writer_lease_ms=reply.writer_lease_ms)
            machine._state = reply.state
            return machine
        except BaseException:
            client.close()
            raise

    def run(self, command: Command) -> Result:
        self._check_open()
        read = isinstance(command, RegisterReader | LeaseSeqno)
        calls = self._history.calls([(self.shard, None if read else command)])
        try:
            reply = self._client.request(RunCommand(self.shard, command), on_resend=calls.resent)
            reply = self._expect(reply, RunReply)
        except BaseException as exc:
            calls.failed(exc)
            raise
        calls.done([reply.result])
        _accumulate(self._stats, reply.work)
        return reply.result

    def state(self, refresh: bool = False) -> ShardState:
        self._check_open()
        if refresh:
            calls = self._history.calls([(self.shard, None)])
            try:
                reply = self._client.request(FetchState(self.shard), on_resend=calls.resent)
                self._state = self._expect(reply, StateReply).state
            except BaseException as exc:
                calls.failed(exc)
                raise
            calls.done([self._state])
        return self._state

    def wait_for_upper_past(self, upper: int, timeout: float | None) -> ShardState:
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _POLL_SLICE_S if deadline is None else deadline - time.monotonic()
            wait = max(0.0, min(left, _POLL_SLICE_S))
            reply = self._client.request(
                WaitForUpper(self.shard, upper, int(wait * 1000)), extra_timeout_s=wait
            )
            self._state = self._expect(reply, StateReply).state
            if self._state.upper > upper:
                return self._state
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"shard {self.shard!r}: upper stayed at {self._state.upper}, not past "
                    f"{upper}, for {timeout} s"
                )

    # --- Maintenance: the server runs it ----------------------------------------------

    def compact(self) -> CompactionReport:
        compaction = self._maintain("compact").compaction
        assert compaction is not None
        return compaction

    def collect_garbage(self) -> GcReport:
        gc = self._maintain("gc").gc
        assert gc is not None
        return gc

    def sweep_leaked_blobs(self, grace_ms: int | None = None) -> list[str]:
        return list(self._maintain("sweep", grace_ms).swept)

    def _maintain(self, job: str, grace_ms: int | None = None) -> MaintainedReply:
        self._check_open()
        reply = self._client.request(
            Maintain(self.shard, job, grace_ms), extra_timeout_s=MAINTAIN_TIMEOUT_S
        )
        return self._expect(reply, MaintainedReply)

    def transactions(self) -> RemoteTransactions:
        """Transactions across shards of this machine's server (each opened through it)."""
        return RemoteTransactions(self._client)

    def versions(self, from_seqno: int, limit: int) -> list[VersionedData]:
        self._check_open()
        reply = self._client.request(ScanVersions(self.shard, from_seqno, limit))
        return [VersionedData(v.seqno, v.data) for v in self._expect(reply, VersionsReply).versions]

    def stats(self) -> MachineStats:
        return msgspec.structs.replace(self._stats)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"shard machine for {self.shard!r} is closed")

    def _expect(self, reply: ServerReply, kind: type):
        if not isinstance(reply, kind):
            raise IndeterminateError(
                f"consensus server {self._client.address} answered {type(reply).__name__}, "
                f"expected {kind.__name__}"
            )
        return reply


def _accumulate(total: MachineStats, work: MachineStats) -> None:
    # the names, not msgspec.structs.fields, which evaluates the annotations
    # on every call: 90 us of a 310 us append's client CPU (cProfile)
    for name in MachineStats.__struct_fields__:
        value = getattr(work, name)
        setattr(total, name, value if name == "last_diff_bytes" else getattr(total, name) + value)
