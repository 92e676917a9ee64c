"""Random ids on the append path: 128 random bits as 32 hex digits, as
``uuid.uuid4().hex`` makes them, without a system call each.

Why: ``uuid4`` reads ``os.urandom``, which lets go of the GIL, and in a
process of many writer threads each let-go hands the GIL to another thread
and waits to get it back (an append drew two: its batch's id and its
token). These come from a generator of this module's own (never the
``random`` module's, which a program may seed), seeded from ``os.urandom``
when imported and again in every forked child, so that a child never
repeats its parent's ids.
"""

from __future__ import annotations

import os
import random

_generator = random.Random()
os.register_at_fork(after_in_child=_generator.seed)


def random_hex() -> str:
    """128 random bits as 32 lowercase hex digits."""
    return f"{_generator.getrandbits(128):032x}"
