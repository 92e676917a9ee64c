"""Range checks of config Structs' fields, each a ``ValueError`` naming the
field, its bound and its value (the same words in every config)."""

from __future__ import annotations

#: The largest TCP port.
MAX_PORT = 65535


def at_least(config: object, least: int, *names: str, prefix: str = "") -> None:
    """``ValueError`` for the first of ``names`` whose value is below ``least``."""
    for name in names:
        value = getattr(config, name)
        if value < least:
            raise ValueError(f"{prefix}{name} must be >= {least}, got {value}")


def positive(config: object, *names: str, prefix: str = "") -> None:
    """``ValueError`` for the first of ``names`` whose value is not above 0."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ValueError(f"{prefix}{name} must be > 0, got {value}")


def port(config: object, name: str) -> None:
    """``ValueError`` unless field ``name`` is ``None`` or a port (0: any free one)."""
    value = getattr(config, name)
    if value is not None and not 0 <= value <= MAX_PORT:
        raise ValueError(f"{name} must be 0 to {MAX_PORT}, got {value}")
