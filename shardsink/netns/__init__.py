"""Emulated hosts on one machine, and the network faults between them.

Hosts are Linux network namespaces on one bridge (:mod:`.network`); faults
are Jepsen-style partitions, loss, delay and clock skew (:mod:`.nemesis`);
a run removes everything it made when it closes, and :func:`sweep` removes
what a dead run left (:mod:`.sweep`). Root only; docs/chaos.md, "Emulated
hosts", has the design and its limits.

This package sits on the bottom floor: it imports only the standard
library, msgspec and the modules beside the floors (``_pids``).
"""

from .clock import shared_names as shared_names
from .names import NETNS_DIR as NETNS_DIR
from .nemesis import Fault as Fault
from .network import MAX_HOSTS as MAX_HOSTS, Network as Network
from .processes import group_members as group_members, processes_in as processes_in
from .sweep import sweep as sweep
from .tools import MissingCapability as MissingCapability, NetnsError as NetnsError, each as each
