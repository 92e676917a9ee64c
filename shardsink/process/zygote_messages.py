"""The messages between a :class:`~.zygote.Zygote` and its zygote (see
:mod:`.zygote`): one per ``SOCK_SEQPACKET`` packet, a request's descriptors
beside it as ``SCM_RIGHTS``; every reply carries the ``id`` of the request it
answers."""

from __future__ import annotations

from typing import Annotated

import msgspec

from .._wire import Message
from .child import Launch

#: Largest control message (a launch with its payload).
MAX_MESSAGE = 1 << 20

_Id = Annotated[int, msgspec.Meta(ge=0)]


class _Control(Message, tag=True, kw_only=True):
    """A control message. ``id`` names a request (unique per client); a reply
    carries the ``id`` of the request it answers."""

    id: _Id


class Fork(_Control):
    """Fork a child running ``launch``, stderr appended to ``log_path``, in
    process group ``pgid`` (0: a new one it leads). With ``stdout_fd`` the
    request carries one descriptor, the child's stdout."""

    launch: Launch
    log_path: str
    pgid: int
    stdout_fd: bool = False


class Reap(_Control):
    """Reap child ``pid`` if it has exited."""

    pid: int


class Forked(_Control):
    """The child's pid; its pidfd travels with this message."""

    pid: int


class Reaped(_Control):
    """``returncode`` of ``pid`` as ``Popen`` gives it; ``None`` if it has not
    exited yet."""

    pid: int
    returncode: int | None


class Refused(_Control, kw_only=True):
    """The zygote could not do it; ``reason`` says why. ``id`` is ``None``
    when the request was too malformed to show one."""

    id: _Id | None
    reason: str


class _Addressed(msgspec.Struct, frozen=True):
    """Only the ``id`` of a request (other fields ignored): read from a request
    that does not decode whole, so that its refusal reaches its sender."""

    id: _Id


ZygoteRequest = Fork | Reap
ZygoteReply = Forked | Reaped | Refused

encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(ZygoteRequest).decode
decode_reply = msgspec.msgpack.Decoder(ZygoteReply).decode
decode_addressed = msgspec.msgpack.Decoder(_Addressed).decode
