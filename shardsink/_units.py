"""Byte sizes: the binary units, and reading and writing a size as text.

Beside the floors: imports nothing of shardsink, so any floor may use it.
"""

from __future__ import annotations

import re

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
#: Multipliers of the size units :func:`parse_size` accepts (unit names compare
#: case-insensitively; ``k``/``M``/``G`` alone are the binary units, as in ``ls -h``).
SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": KIB,
    "kb": 1000,
    "kib": KIB,
    "m": MIB,
    "mb": 1000**2,
    "mib": MIB,
    "g": GIB,
    "gb": 1000**3,
    "gib": GIB,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A byte count written as ``1048576``, ``1MiB``, ``64 KiB``, ``1.5GiB`` or ``10MB``.

    Units are those of :data:`SIZE_UNITS`; a fraction must come to a whole number
    of bytes. Raises ``ValueError`` naming ``text`` for anything else.
    """
    match = _SIZE.fullmatch(text)
    unit = SIZE_UNITS.get(match.group(2).lower()) if match else None
    if unit is None:
        raise ValueError(
            f"invalid size {text!r}: a number of bytes, optionally with a unit "
            "(B, KiB, MiB, GiB, kB, MB, GB), e.g. 1MiB"
        )
    value = float(match.group(1)) * unit
    if not value.is_integer():
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    """``n`` bytes in the largest binary unit that divides it (``1MiB``, ``32KiB``, ``100B``)."""
    for name in ("GiB", "MiB", "KiB"):
        unit = SIZE_UNITS[name.lower()]
        if n and n % unit == 0:
            return f"{n // unit}{name}"
    return f"{n}B"
