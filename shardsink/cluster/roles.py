"""The roles of a cluster's children: builder, host builder, worker and consensus.

The zygote forks them by name; ``python -m shardsink.cluster PARENT spawn
ROLE`` starts one as a fresh interpreter (``--start spawn``; the package's
``__main__``, so this module is imported once, not run as ``__main__`` too). A builder
or worker gets its :class:`~shardsink.protocol.ChildSpec` as its payload,
names itself in ``ps``, arms the fault points its environment names
(:mod:`shardsink.faults`) and logs to its stderr (its log file). SIGINT is
ignored: the coordinator handles Ctrl-C and tells its children to stop.
"""

from __future__ import annotations

import logging
import signal

from setproctitle import setproctitle

from .. import faults
from ..protocol import decode_spec
from ..server._cli import serve_role
from ..worker.builder import run_builder
from ..worker.worker import run_worker

ENTRY = "shardsink.cluster"


def _member(role: str, name: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setproctitle(f"shardsink {role} {name}")
    faults.arm_from_env(role=f"{role} {name}")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )


def builder(payload: bytes) -> int:
    spec = decode_spec(payload)
    _member("builder", f"g{spec.group}")
    return run_builder(spec)


def host_builder(payload: bytes) -> int:
    """The host builder of ``coalesce`` host (role ``builder host``)."""
    spec = decode_spec(payload)
    _member("builder", "host")
    return run_builder(spec, host=True)


def worker(payload: bytes) -> int:
    spec = decode_spec(payload)
    _member("worker", f"g{spec.group}/w{spec.index}")
    return run_worker(spec)


ROLES = {"builder": builder, "host": host_builder, "worker": worker, "consensus": serve_role}
