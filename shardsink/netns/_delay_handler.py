"""The delay nemesis's packet holder, run inside one host's namespace.

Its settings (:class:`Holding`) come as one JSON argument, decoded
strictly. Bound to NFQUEUE ``queue``, it holds every packet it is given for
``delay_ms`` (plus a uniform draw in ``[-jitter_ms, +jitter_ms]``, at least
0, seeded by the queue number; with jitter, packets may leave out of order,
as with netem) and then accepts it. It prints ``ready`` once bound, and stops
cleanly when its standard input closes (its starter closed it, or died) or
on SIGTERM: everything held is accepted before the queue is unbound (a
queue destroyed with packets in it drops them).

Run by path (``python -P .../_delay_handler.py JSON``), not as a module of
shardsink: it imports only the standard library, msgspec and netfilterqueue,
so it starts without shardsink's imports (``time python -c 'import
shardsink'``: 0.97 s here). Imported as a module (its starter encodes
:class:`Holding`) it does nothing and needs no netfilterqueue.
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import select
import signal
import sys
import time
import warnings

import msgspec

#: Packets the kernel keeps queued for us before dropping new ones: 50 ms of
#: a 1 Gbit/s stream of full frames is about 4,200 packets.
MAX_QUEUED = 16384


class Holding(msgspec.Struct, forbid_unknown_fields=True):
    """What a holder does: hold each packet of NFQUEUE ``queue`` ``delay_ms``
    milliseconds, +- a uniform ``jitter_ms``."""

    queue: int
    delay_ms: float
    jitter_ms: float = 0.0


def main(argv: list[str]) -> int:
    """Hold packets as ``argv``'s one argument, a JSON :class:`Holding`, says,
    until stdin closes or SIGTERM. ``ValueError`` (a ``msgspec.DecodeError``
    naming the field, if one) for anything but one such argument."""
    (text,) = argv
    holding = msgspec.json.decode(text, type=Holding, strict=True)
    # imported here: importing the module (to encode a Holding) needs no netfilterqueue
    from netfilterqueue import COPY_META, NetfilterQueue

    draw = random.Random(holding.queue)
    order = itertools.count()
    held: list[tuple[float, int, object]] = []  # (release time, arrival order, packet)

    def hold(packet) -> None:
        wait_ms = max(0.0, holding.delay_ms + draw.uniform(-holding.jitter_ms, holding.jitter_ms))
        heapq.heappush(held, (time.monotonic() + wait_ms / 1000, next(order), packet))

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    queue = NetfilterQueue()
    with warnings.catch_warnings():  # a smaller socket buffer than asked is not an error
        warnings.simplefilter("ignore")
        queue.bind(holding.queue, hold, max_len=MAX_QUEUED, mode=COPY_META)
    try:
        print("ready", flush=True)
        _serve(queue, held)
    finally:
        for *_, packet in held:
            packet.accept()
        queue.unbind()
    return 0


def _serve(queue, held: list) -> None:
    """Accept each held packet when its time comes, until stdin closes."""
    packets, stdin = queue.get_fd(), sys.stdin.fileno()
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            heapq.heappop(held)[2].accept()
        timeout = max(0.0, held[0][0] - now) if held else None
        ready = select.select([packets, stdin], [], [], timeout)[0]
        if stdin in ready and not os.read(stdin, 4096):
            return
        if packets in ready:
            queue.run(block=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
