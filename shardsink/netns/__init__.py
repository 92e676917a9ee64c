"""Emulated hosts on one machine, and the network faults between them.

Hosts are Linux network namespaces on one bridge (:mod:`.network`); faults
are Jepsen-style partitions, loss, delay and clock skew (:mod:`.nemesis`);
a run removes everything it made when it closes, and :func:`sweep` removes
what a dead run left (:mod:`.sweep`). Root only; docs/chaos.md, "Emulated
hosts", has the design and its limits.

This package sits on the bottom floor: it imports only the standard
library, msgspec and the modules beside the floors (``_pids``).
"""

from .nemesis import Fault as Fault
from .network import Network as Network
from .sweep import sweep as sweep
from .tools import MissingCapability as MissingCapability
from .tools import NetnsError as NetnsError
