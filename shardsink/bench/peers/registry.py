"""The table formats by name: each imported only when a peer of its runs
(the ``bench`` extra brings both libraries)."""

from __future__ import annotations

from .formats import Format


def format_named(name: str) -> Format:
    """The format ``delta`` or ``iceberg``; ``ValueError`` for another."""
    if name == "delta":
        from .delta import DELTA

        return DELTA
    if name == "iceberg":
        from .iceberg import ICEBERG

        return ICEBERG
    raise ValueError(f"unknown table format {name!r}; choose delta or iceberg")
