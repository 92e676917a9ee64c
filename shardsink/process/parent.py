"""Children die with their parent: ``PR_SET_PDEATHSIG``, checked against a race.

The kernel sends the signal when the thread that forked the child exits, so
a child must check, after the ``prctl``, that its parent is still the one it
was started by: a parent that died in between left it re-parented already.
A zygote's children name the zygote; the zygote names the coordinator, so
the chain holds whoever forked whom.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent exits; exit now (status 1) if the
    parent is no longer ``parent``. ``OSError`` if the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)
