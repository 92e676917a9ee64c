"""Memory allocation for a process that runs for days and merges in bursts.

A consensus server spends most of its life holding a bounded state and, now
and then, runs a merge that allocates and frees Arrow buffers window after
window. Two allocator defaults keep such a process at the size of its
largest merge's churn rather than of what the merge holds:

- pyarrow's default pool (mimalloc on Linux wheels) keeps freed pages for
  reuse: a merge of 2M rows into 8 MiB parts peaked 48-52 MiB above the
  process's size while the pool never held more than 16 MiB;
- glibc raises its mmap threshold to the size of any mapped block freed (up
  to 32 MiB), after which Arrow's window-sized buffers come from the heap and
  stay resident between frees.

:func:`lean_allocators` makes Arrow allocate through the C library and pins
glibc's mmap threshold at its default starting value: the same merge into
4 MiB parts peaked 24-25 MiB above, against 41-45 MiB with the system pool
alone (measured side by side on this 2-core machine).
"""

from __future__ import annotations

import ctypes
import ctypes.util

import pyarrow as pa

#: glibc's ``M_MMAP_THRESHOLD`` parameter of ``mallopt`` (malloc.h).
_M_MMAP_THRESHOLD = -3
#: glibc's starting threshold; pinning it turns off the dynamic raise.
MMAP_THRESHOLD_BYTES = 128 * 1024
#: The pool Arrow's C++ code allocates from (Parquet, group-by): chosen when
#: pyarrow loads, so :func:`lean_allocators` cannot move it.
_NATIVE_POOL = pa.default_memory_pool()


def lean_allocators() -> bool:
    """Route pyarrow's default pool to the C library's allocator and pin
    glibc's mmap threshold (:data:`MMAP_THRESHOLD_BYTES`). Call it once, at
    the start of a long-running process, before it allocates much. Returns
    whether glibc took the threshold (``False`` off glibc, e.g. musl or
    macOS, where only the pool changes). Arrow's C++ code keeps the pool
    chosen when pyarrow loaded (``ARROW_DEFAULT_MEMORY_POOL``), so
    :func:`release_freed_pages` releases both."""
    pa.set_memory_pool(pa.system_memory_pool())
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def release_freed_pages() -> None:
    """Hand the pages Arrow freed back to the OS, from pyarrow's default pool
    and the one Arrow's C++ code uses. mimalloc keeps them for reuse, so each
    window's group-by scratch would stay resident and a stream's peak RSS
    grow well past what it holds; the system pool trims glibc's heap."""
    pa.default_memory_pool().release_unused()
    if _NATIVE_POOL.backend_name != pa.default_memory_pool().backend_name:
        _NATIVE_POOL.release_unused()
