"""What a long benchmark shows while it measures: the callbacks its
``shardsink bench`` command passes in and renders (``cli/bench.py``), each
showing nothing by default, so that a benchmark run from code or a test
prints nothing. (The racing benchmarks' spinner is :data:`.clients.Status`.)"""

from __future__ import annotations

from collections.abc import Callable

#: Called with a line saying what was just measured (the command prints it).
Note = Callable[[str], None]


def nothing(line: str) -> None:
    """The :data:`Note` that shows nothing."""
