"""The suite's leak check sees a process the test started even after its
parent died and it was re-parented (the case of a SIGKILLed ``shardsink up``)."""

from __future__ import annotations

import os
import signal
import subprocess

from tests.helpers.wait import wait_until


def test_an_orphaned_grandchild_is_seen(own_processes) -> None:
    # the shell starts a sleeper in the background and exits at once
    script = "sleep 60 >/dev/null 2>&1 & echo $!"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    orphan = int(out.stdout)
    try:
        assert orphan in own_processes()
    finally:
        os.kill(orphan, signal.SIGKILL)  # ours: started by this test
    wait_until(lambda: orphan not in own_processes(), 10, f"the end of the orphan {orphan}")
