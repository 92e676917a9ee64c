"""Control messages between a worker and its builder (MessagePack, msgspec).

Worker to builder: :class:`Part` (a reference into the worker's arena),
:class:`MessagePart` (a small part's Arrow IPC bytes in the message itself) and
:class:`Retire` (segments the worker has unlinked). Builder to worker:
:class:`Ack` (parts the builder is done with) and :class:`Error`.

Each direction is a tagged union decoded strictly (no type coercion, unknown
fields rejected); nothing is ever pickled.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .._wire import Message

_Count = Annotated[int, msgspec.Meta(ge=0)]
_Segment = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
Metadata = dict[str, int | str]


class PartRef(Message, array_like=True):
    """Where a part lies: ``length`` bytes at ``offset`` of ``segment``, stamped
    with the arena's part ``id`` (which the reader checks against the bytes)."""

    segment: _Segment
    offset: _Count
    length: Annotated[int, msgspec.Meta(gt=0)]
    id: _Count


class _Tagged(Message, tag_field="t"):
    """A member of either direction's tagged union, its tag in field ``t``."""


class Part(_Tagged, tag="part"):
    """The ``seq``-th message of a sender: a part in its arena, plus caller metadata."""

    seq: _Count
    ref: PartRef
    meta: Metadata = {}


class MessagePart(_Tagged, tag="inline"):
    """The ``seq``-th message of a sender: a small part's Arrow IPC stream bytes."""

    seq: _Count
    data: bytes
    meta: Metadata = {}


class Retire(_Tagged, tag="retire"):
    """Segments the sender has unlinked; the builder drops its mappings of them."""

    segments: list[_Segment]


class Ack(_Tagged, tag="ack"):
    """The builder is done with these parts; their space may be overwritten."""

    refs: list[PartRef]


class Error(_Tagged, tag="error"):
    """The builder could not take message ``seq`` (``None``: not decodable)."""

    seq: _Count | None
    reason: str


ToBuilder = Part | MessagePart | Retire
ToWorker = Ack | Error

encode = msgspec.msgpack.Encoder().encode
decode_to_builder = msgspec.msgpack.Decoder(ToBuilder).decode
decode_to_worker = msgspec.msgpack.Decoder(ToWorker).decode
