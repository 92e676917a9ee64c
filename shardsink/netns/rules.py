"""The firewall rules of each network fault, as ``iptables-restore`` input.

Pure text, no I/O. Every fault is one chain of its own in the host's
``filter`` table, jumped to from ``INPUT`` and applied and removed with one
``iptables-restore --noflush`` each (atomic). Faults act on what a host
*receives*: a ``DROP`` in ``OUTPUT`` fails the sender's own ``sendto`` with
``EPERM`` (a UDP echo server here died of it), which no real network does,
while a packet dropped on arrival is silently lost, as on a wire.

Drop chains go first in ``INPUT``, queue chains last: a packet the delay
handler accepts leaves ``INPUT`` at once, so a drop after it would never see
it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: The interface of every host (its end of the veth to the switch).
INTERFACE = "eth0"


def chain_name(fault_id: int) -> str:
    """The chain of fault ``fault_id`` (iptables allows 28 characters)."""
    return f"shardsink-f{fault_id}"


def add_chain(chain: str, rules: Sequence[str], *, first: bool) -> str:
    """Create ``chain`` holding ``rules`` and jump to it from ``INPUT``, before
    every other rule (``first``) or after them."""
    jump = f"-I INPUT 1 -j {chain}" if first else f"-A INPUT -j {chain}"
    body = [f"-A {chain} {rule}" for rule in rules]
    return "\n".join(["*filter", f":{chain} - [0:0]", *body, jump, "COMMIT", ""])


def remove_chain(chain: str) -> str:
    """Undo :func:`add_chain`."""
    return "\n".join(
        ["*filter", f"-D INPUT -j {chain}", f"-F {chain}", f"-X {chain}", "COMMIT", ""]
    )


def drop_from(addresses: Iterable[str]) -> list[str]:
    """Drop every packet from ``addresses``."""
    return [f"-i {INTERFACE} -s {address} -j DROP" for address in addresses]


def drop_all() -> list[str]:
    """Drop every packet arriving from the switch (loopback still works)."""
    return [f"-i {INTERFACE} -j DROP"]


def drop_randomly(probability: float) -> list[str]:
    """Drop each packet arriving from the switch with ``probability``."""
    return [f"-i {INTERFACE} -m statistic --mode random --probability {probability:.6f} -j DROP"]


def queue(number: int) -> list[str]:
    """Hand every packet arriving from the switch to NFQUEUE ``number``;
    ``--queue-bypass``: with no handler bound the packet passes, so a dead
    handler never blackholes the host."""
    return [f"-i {INTERFACE} -j NFQUEUE --queue-num {number} --queue-bypass"]
