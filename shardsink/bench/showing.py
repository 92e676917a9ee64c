"""What a long benchmark shows while it measures: the callbacks its
``shardsink bench`` command passes in and renders (``cli/bench.py``), each
showing nothing by default, so that a benchmark run from code or a test
prints nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol

#: Called with a line saying what runs, and entered around that run (the
#: racing benchmarks': the command's spinner, its console's ``status``);
#: ``contextlib.nullcontext`` shows nothing.
Status = Callable[[str], contextlib.AbstractContextManager]

#: Called with a line saying what was just measured (the command prints it).
Note = Callable[[str], None]


def nothing(line: str) -> None:
    """The :data:`Note` that shows nothing."""


class Steps(Protocol):
    """A count of done steps toward a total, shown as the run goes."""

    def advance(self) -> None:
        """One more step is done."""

    def describe(self, what: str) -> None:
        """The step now running is ``what``."""

    def note(self, line: str) -> None:
        """``line`` shown beside the count (how a step ended, say)."""


#: Called with what the steps are and how many there are, and entered
#: around them: the :class:`Steps` to count them on (the command's progress
#: bar, there while it is entered).
Bar = Callable[[str, int], contextlib.AbstractContextManager[Steps]]


class _Unseen:
    """:class:`Steps` that show nothing."""

    def advance(self) -> None:
        pass

    def describe(self, what: str) -> None:
        pass

    def note(self, line: str) -> None:
        pass


@contextlib.contextmanager
def no_bar(description: str, total: int) -> Iterator[Steps]:
    """The :data:`Bar` that shows nothing."""
    yield _Unseen()
