"""Errors of a running cluster."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster cannot go on: a process that does not come up, more
    restarts than allowed, an interval that keeps failing. The message names
    the process or interval and quotes the relevant log."""
