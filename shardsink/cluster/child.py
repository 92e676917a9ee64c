"""Entry point of a cluster's child processes.

``python -m shardsink.cluster.child PARENT_PID ROLE [ARGS...]`` where ROLE is
``builder`` or ``worker`` (their :class:`~shardsink.protocol.ChildSpec`
comes as JSON on stdin) or a ``shardsink`` command (``consensus``, and for
``shardsink chaos``: ``up``, ``shard``) whose arguments ARGS are. Before
anything else the child arranges to be SIGKILLed when its parent dies
(``PR_SET_PDEATHSIG``) and then checks that its parent is still
``PARENT_PID``, which closes the race with a parent that died before the
``prctl``; then it names itself in ``ps`` and arms the fault points its
environment names (``shardsink.faults``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent exits; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str]) -> int:
    parent, role, *rest = argv
    die_with_parent(int(parent))
    # The coordinator handles Ctrl-C and tells its children to stop; a
    # coordinator (``up``) is itself stopped by Ctrl-C.
    if role != "up":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if role not in ("builder", "worker"):
        from ..cli import main as cli_main

        return cli_main([role, *rest])
    from setproctitle import setproctitle

    from .. import faults
    from ..protocol import decode_spec

    spec = decode_spec(sys.stdin.buffer.read())
    name = f"g{spec.group}" if role == "builder" else f"g{spec.group}/w{spec.index}"
    setproctitle(f"shardsink {role} {name}")
    faults.arm_from_env(role=f"{role} {name}")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s"
    )
    if role == "builder":
        from ..worker.builder import run_builder

        return run_builder(spec)
    if role == "worker":
        from ..worker.worker import run_worker

        return run_worker(spec)
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
