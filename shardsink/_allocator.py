"""The consensus server's allocator policy, set where the process starts.

A consensus server holds a bounded state for days and now and then runs a
merge that allocates and frees Arrow buffers window after window. Every
Arrow allocation of a merge, Parquet's and ``group_by``'s included, comes
from the pool Arrow's C++ code chose when pyarrow loaded, which only the
environment picks (``ARROW_DEFAULT_MEMORY_POOL``; mimalloc by default on
Linux wheels). ``pyarrow.set_memory_pool`` moves only the pool pyarrow's
Python-level calls default to, and glibc reads ``MALLOC_*`` settings only
when it starts: so the policy lives in the server's environment,
:data:`SERVER_ENV`, which the server's launcher
(:class:`~shardsink.process.consensus.ConsensusProcess`) gives a fresh
interpreter and ``shardsink consensus serve`` re-executes itself with
(:func:`missing_server_env`).

It is the system pool (glibc's malloc) with its default dynamic mmap
threshold and at most two malloc arenas, and the server hands a merge pass's
freed pages back to the OS after the pass (:func:`release_freed_pages`:
``malloc_trim``). glibc gives each thread that allocates (the merge lanes,
Arrow's thread pools) an arena of its own otherwise, and what an arena keeps
free between passes ``malloc_trim`` returns only in whole pages. The figures
behind the choice, a 2M-row merge in each environment in its own interpreter
(``shardsink bench allocators``) and 20,000-interval soaks of each
(``shardsink bench soak``), are in docs/benchmarks.md (Allocators of the
consensus process, Running for days).

Library code that runs in users' processes (reads, ``Shard.compact``,
verification) never calls anything here: a library has no business
choosing a process's allocator or trimming its heap.
"""

from __future__ import annotations

import os

import pyarrow as pa

#: The consensus server's environment additions: Arrow's every allocation
#: through glibc's malloc, in at most two arenas, whose freed pages
#: :func:`release_freed_pages` can return.
SERVER_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}


def missing_server_env(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """What of :data:`SERVER_ENV` ``environ`` lacks (a variable it sets
    otherwise is the operator's choice and stays)."""
    return {k: v for k, v in SERVER_ENV.items() if k not in environ}


def release_freed_pages() -> None:
    """Hand the pages Arrow's default pool holds free back to the OS: with
    :data:`SERVER_ENV`, ``malloc_trim(0)`` of every glibc arena; with
    mimalloc, its collection. For a long-running server between merge
    passes; it changes the process's heap, so library code does not call it."""
    pa.default_memory_pool().release_unused()
