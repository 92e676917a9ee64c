"""A subcommand described by its module's docstring: how every ``bench``
command is added."""

from __future__ import annotations

import argparse
from pathlib import Path


def described(
    group, name: str, module, summary: str, func, *, out: bool = True
) -> argparse.ArgumentParser:
    """``group``'s command ``name`` (``summary`` in the list, ``module``'s
    docstring as its description), running ``func``; with ``out``, its
    required ``--out DIR``."""
    parser = group.add_parser(
        name,
        help=summary,
        description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if out:
        parser.add_argument(
            "--out", type=Path, required=True, metavar="DIR", help="output directory"
        )
    parser.set_defaults(func=func)
    return parser
