"""Storage error types.

Every failure of a storage call is one of two kinds, and callers act on the kind:

- :class:`DeterminateError`: the call did **not** take effect (a refused
  connection, a bad argument, a write that failed before anything was stored).
  Retrying is safe without looking first.
- :class:`IndeterminateError`: the call **may or may not** have taken effect (a
  timeout, a connection lost mid-commit). A caller that needs to know must
  re-read (for consensus: the head) before deciding what to retry.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every storage failure; never raised directly."""


class DeterminateError(StorageError):
    """The operation did not happen; safe to retry as is."""


class IndeterminateError(StorageError):
    """The operation may have happened; re-read state before retrying."""
