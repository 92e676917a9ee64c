"""The one base of every message that crosses a socket, a pipe or shared
memory between shardsink's processes.

A message module (``protocol.py``, ``shm/messages.py``, ``server/wire.py``,
``process/zygote_messages.py``, ``process/consensus.py``'s ``Ready``) derives
its messages from :class:`Message`, gives each member of a tagged union its
tag, and encodes and decodes with ``encode = msgspec.msgpack.Encoder().encode``
and typed decoders ``decode_x = msgspec.msgpack.Decoder(T).decode``, which
reject unknown fields and tags and coerce nothing. Nothing is pickled.

``persist/`` keeps its own Structs: shard state and diffs are stored, and
their bytes must not change with this base.
"""

from __future__ import annotations

import msgspec


class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A wire message: immutable, and a field its decoder does not know is an
    error (a peer of another version is refused, never half understood)."""
