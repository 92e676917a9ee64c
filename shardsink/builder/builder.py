"""The builder process of a group (and, with ``coalesce`` host, the host
builder): its mains, its sockets and its loop around a
:class:`~shardsink.builder.group.GroupBuilder` per shard of the workload
(:class:`~shardsink.builder.shards.ShardBuilders`).

Workers send their parts through the shared-memory link
(:class:`~shardsink.shm.PartReceiver`); the coordinator's messages come on a
DEALER socket, the workers' handoff hellos and the answers to their finishes
on a ROUTER. Finishes that arrive in one burst are decided after every part
of the burst has joined, so workers whose parts overlap in time share one
batch in best-effort mode; with a linger, a best-effort finish that would
hand the batch off before every worker joined waits up to ``linger_s`` for
the others (the loop runs the machine's clock). The builder holds at most the
link's outstanding parts plus one part in progress.

With ``coalesce`` host the same code runs twice over: the host builder
(:func:`host_main`, :func:`run_builder` with ``host``) builds one batch per
host from the groups' parts. It answers the group builder that finished last
with the host batch, and that group builder relays it to the last finisher of
its generation, which reports it to the coordinator.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import msgspec
import zmq

from .. import faults, protocol, workloads
from .._address import check_address
from ..process import enter_member
from ..shm import PartReceiver
from .group import GroupBuilder
from .host_link import HostLink
from .shards import Finish, ShardBuilders

log = logging.getLogger(__name__)

#: How long the builder waits for a part before it looks at its other sockets.
POLL_S = 0.05


def main(payload: bytes) -> int:
    """A group builder's process main (:data:`~shardsink.protocol.BUILDER_ROLE`):
    ``payload`` is its :class:`~shardsink.protocol.ChildSpec`; its exit status."""
    spec = protocol.decode_spec(payload)
    enter_member("builder", f"g{spec.group}")
    return run_builder(spec)


def host_main(payload: bytes) -> int:
    """The host builder's process main (:data:`~shardsink.protocol.HOST_BUILDER_ROLE`,
    ``coalesce`` host): ``payload`` is its :class:`~shardsink.protocol.ChildSpec`."""
    spec = protocol.decode_spec(payload)
    enter_member("builder", "host")
    return run_builder(spec, host=True)


def run_builder(spec: protocol.ChildSpec, *, host: bool = False) -> int:
    """The builder process's main loop; returns the exit code. ``host``: the
    host builder (``coalesce`` host), whose workers are the group builders;
    otherwise group ``spec.group``'s builder, connected to the host builder
    when ``spec.host_parts`` names one."""
    from ..faults import open_blob

    config = spec.config
    name = protocol.host_builder_name(spec.host) if host else f"g{spec.group}"
    ctx = zmq.Context()
    coord = ctx.socket(zmq.DEALER)
    coord.setsockopt(zmq.IDENTITY, (name if host else f"{name}/b").encode())
    coord.setsockopt(zmq.LINGER, 1000)
    handoff = ctx.socket(zmq.ROUTER)
    handoff.setsockopt(zmq.ROUTER_MANDATORY, 1)
    handoff.setsockopt(zmq.LINGER, 0)
    receiver: PartReceiver | None = None
    group: ShardBuilders | None = None
    upstream: HostLink | None = None
    blob = open_blob(config.blob_uri)
    try:
        spec.connect_coordinator(coord)
        # the workload's shard schemas: what the senders send is checked against them
        workload = workloads.of(config)
        schemas = workloads.shard_schemas(workload, config.workload, config.shard)
        if spec.host_parts and not host:
            upstream = HostLink(spec, ctx, list(schemas.values()))
        handoff.bind(check_address(spec.handoff, for_bind=True))
        coord.send(protocol.encode(protocol.Hello("builder", spec.group, 0, os.getpid())))
        members = _wait_members(coord, handoff, config.start_timeout_s)
        if members is None:
            return 0
        # one schema: the receiver checks every part against it; several: each
        # shard's builder checks its own parts
        one = next(iter(schemas.values())) if len(schemas) == 1 else None
        receiver = PartReceiver(
            spec.parts, spec.cluster_id, creators=members.worker_pids, schema=one
        )
        if upstream is not None:
            upstream.connect(config.start_timeout_s)
        senders = (spec.host_groups or tuple(range(config.groups))) if host else config.workers
        builders = [
            GroupBuilder(
                spec.group,
                senders,
                blob,
                name,
                inline_max_bytes=spec.inline_max_bytes,
                target_bytes=config.blob_target_bytes,
                ack=receiver.ack,
                linger_s=config.best_effort_linger_ms / 1000,
                upstream=upstream,
                host=host,
                host_index=spec.host,
                shard_index=index,
                schema=None if one is not None else schema,
            )
            for index, (name, schema) in enumerate(schemas.items())
        ]
        group = ShardBuilders(builders, receiver.ack)
        _loop(receiver, group, coord, handoff)
        return 0
    except Exception as exc:
        log.exception("builder %s failed", name)
        _report_failure(coord, f"builder {name}: {type(exc).__name__}: {exc}")
        return 1
    finally:
        if group is not None:
            group.close()
        if receiver is not None:
            receiver.close()
        if upstream is not None:
            upstream.close()
        blob.close()
        coord.close()
        handoff.close()
        ctx.term()


def _wait_members(
    coord: zmq.Socket, handoff: zmq.Socket, timeout_s: float
) -> protocol.Members | None:
    """Welcome workers until the coordinator sends the group's member pids;
    ``None`` on :class:`Shutdown`. ``TimeoutError`` after ``timeout_s``."""
    poller = zmq.Poller()
    poller.register(coord, zmq.POLLIN)
    poller.register(handoff, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        events = dict(poller.poll(int(left * 1000) + 1))
        if handoff in events:
            _welcome(handoff)
        if coord in events:
            try:
                msg = protocol.decode_to_child(coord.recv())
            except msgspec.DecodeError as exc:
                log.warning("malformed message from the coordinator: %s", exc)
                continue
            if isinstance(msg, protocol.Members):
                return msg
            if isinstance(msg, protocol.Shutdown):
                return None
    raise TimeoutError(f"no member list from the coordinator within {timeout_s}s")


def _welcome(handoff: zmq.Socket) -> None:
    """Answer every queued :class:`HandoffHello` with a :class:`Welcome`."""
    while True:
        try:
            frames = handoff.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            peer, raw = frames
            protocol.decode_handoff_hello(raw)
        except (ValueError, msgspec.DecodeError) as exc:
            log.warning("malformed handoff hello: %s", exc)
            continue
        handoff.send_multipart([peer, protocol.encode(protocol.Welcome())])


def _loop(
    receiver: PartReceiver, group: ShardBuilders, coord: zmq.Socket, handoff: zmq.Socket
) -> None:
    upstream = group.upstream
    while True:
        burst: list[Finish] = []
        finishing: set[tuple[bytes, object]] = set()  # (sender, shard) with a finish in the burst
        deadline = group.next_deadline()
        wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
        if upstream is None:
            part = receiver.recv(max(0.0, wait))
        else:  # the host builder's answers wake the loop as parts do
            ready = [(receiver.socket, zmq.POLLIN), (upstream.socket, zmq.POLLIN)]
            zmq.zmq_poll(ready, max(0, int(wait * 1000)))
            part = receiver.recv(0)
        while part is not None:
            handle = (part.sender, part.meta.get("shard", 0))
            if handle in finishing:
                # a group builder may finish a handle and join again in one
                # burst: its finish is decided before its next join is taken
                _decide(group, handoff, burst)
                finishing.clear()
            try:
                finish = group.take(part)
            except msgspec.ValidationError as exc:
                log.warning("%s: a part without a valid contribution: %s", group.label, exc)
                finish = None
            if finish is not None:
                burst.append(finish)
                finishing.add(handle)
            part = receiver.recv(0)
        _decide(group, handoff, burst)
        group.expire(time.monotonic())
        stop = _handle_coordinator(group, coord)
        answers = group.resolved()
        if upstream is not None:
            answers += [a for h in upstream.answers() for a in group.relay(h)]
        for worker, answer in answers:
            _send(handoff, group, worker, answer)
        if stop:
            return
        _welcome(handoff)


def _decide(group: ShardBuilders, handoff: zmq.Socket, burst: list[Finish]) -> None:
    """Decide and answer the finishes of ``burst``, emptying it."""
    now = time.monotonic()
    for finish in burst:
        answer = group.finish(finish, now)
        if answer is not None:
            _send(handoff, group, finish[2], answer)
    burst.clear()


def _send(handoff: zmq.Socket, group: ShardBuilders, worker: int, answer: protocol.Handoff) -> None:
    if answer.shared is not None:
        faults.point("builder.before_handoff")
    try:
        handoff.send_multipart([protocol.worker_identity(worker), protocol.encode(answer)])
    except zmq.ZMQError as exc:  # the worker is gone; its group is being restarted
        log.warning("%s: cannot answer worker %d: %s", group.label, worker, exc)


def _handle_coordinator(group: ShardBuilders, coord: zmq.Socket) -> bool:
    """Handle queued coordinator messages; ``True`` on :class:`Shutdown`."""
    for msg in protocol.queued(coord, protocol.decode_to_child, f"{group.label}'s coordinator"):
        if isinstance(msg, protocol.Shutdown):
            return True
        if isinstance(msg, protocol.Abandon):
            group.abandon((msg.interval, msg.attempt))
    return False


def _report_failure(coord: zmq.Socket, reason: str) -> None:
    with contextlib.suppress(zmq.ZMQError):
        coord.send(protocol.encode(protocol.Failure(os.getpid(), reason)), zmq.NOBLOCK)
