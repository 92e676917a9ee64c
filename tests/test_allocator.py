"""A long-running server's allocators (``shardsink._allocator``): each case
runs in a fresh interpreter, as the settings are the process's own."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

GLIBC = platform.libc_ver()[0] == "glibc"

# Frees a 16 MiB block (glibc then raises its mmap threshold to 16 MiB unless
# it is pinned), then frees every other one of 256 blocks of 256 KiB: blocks
# that came from the heap leave holes glibc cannot return; mapped ones go back.
_CHURN = """
import sys, psutil
from shardsink._allocator import lean_allocators
took = lean_allocators() if sys.argv[1] == "lean" else None
import pyarrow as pa
process = psutil.Process()
big = bytearray(16 << 20); del big
before = process.memory_info().rss
blocks = [bytearray(256 << 10) for _ in range(256)]
for block in blocks: block[::4096] = b"x" * len(block[::4096])
del blocks[::2]
print(took, pa.default_memory_pool().backend_name, (process.memory_info().rss - before) >> 20)
"""


def _churn(mode: str) -> tuple[str, str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, timeout=60, check=True
    )
    took, backend, grown = out.stdout.split()
    return took, backend, int(grown)


@pytest.mark.skipif(not GLIBC, reason="the mmap threshold is glibc's")
def test_pinned_mmap_threshold_returns_freed_blocks_to_the_os() -> None:
    took, backend, grown = _churn("lean")
    assert (took, backend) == ("True", "system")
    # the 128 blocks kept hold 32 MiB; the 128 freed ones are gone
    assert grown < 40
    _, default_backend, default_grown = _churn("default")
    assert default_backend != "system" and default_grown >= 56  # the holes stay
