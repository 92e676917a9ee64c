"""The optional dependencies (``pyproject.toml``'s extras) and the one error
for a missing one, which names the ``pip install`` that brings it.

Beside the floors: imports only the standard library, so any floor may
check an extra before it imports what the extra brings.
"""

from __future__ import annotations

import importlib.util


class MissingExtra(ValueError):
    """What a command or call needs is not installed; the message is one line
    naming the missing modules and the ``pip install 'shardsink[EXTRA]'`` to
    run. A ``ValueError``, which the command line prints without a traceback."""


def missing(*modules: str) -> list[str]:
    """Those of ``modules`` that cannot be imported, found without importing them."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(what: str, extra: str, *modules: str) -> None:
    """:class:`MissingExtra` if any of ``modules`` (what the extra ``extra``
    brings) is missing, saying that ``what`` needs it."""
    gone = missing(*modules)
    if gone:
        raise MissingExtra(
            f"{what} needs {' and '.join(gone)}, which {'is' if len(gone) == 1 else 'are'} "
            f"not installed: pip install 'shardsink[{extra}]'"
        )
